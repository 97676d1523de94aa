//! The migration of the format before (`mqtt.state` + `mqtt-journal/`) on the committed data
//! directory of release 844fe42 killed with SIGKILL (its journal ahead of an empty
//! checkpoint): read once, written as one checkpoint into `mqtt/`, the old files moved to
//! `legacy-1/`; two more starts read the same; a migration cut before its `K` is done again.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use hayate_broker::{Broker, BrokerConfig};
use hayate_front::auth::ConfigAuth;
use hayate_front::config::Config;
use hayate_log::{FsRoot, FsyncPolicy};

use super::checkpoint::{Records, snapshot_of};
use super::legacy::{FILE, JOURNAL_DIR, LEGACY_DIR};
use super::tests::{View, view_of_saved};
use super::*;
use crate::journal::Journal;

const FIXTURE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../hayate/tests/fixtures/data-844fe42-kill"
);

fn fixture(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("hayate-mqtt-mig-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    std::fs::copy(Path::new(FIXTURE).join(FILE), d.join(FILE)).unwrap();
    // The old journal: segment files, no subdirectory.
    std::fs::create_dir_all(d.join(JOURNAL_DIR)).unwrap();
    for e in std::fs::read_dir(Path::new(FIXTURE).join(JOURNAL_DIR)).unwrap() {
        let e = e.unwrap().path();
        std::fs::copy(&e, d.join(JOURNAL_DIR).join(e.file_name().unwrap())).unwrap();
    }
    d
}

/// A broker start and stop on `dir` (recovery, then the checkpoint at shutdown).
fn start_stop(dir: &Path) {
    start_stop_recovering(dir, true);
}

/// A start and stop on `dir`, with or without recovering the saved state first.
fn start_stop_recovering(dir: &Path, recover: bool) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let broker = Broker::new(BrokerConfig {
            data_dir: Some(dir.to_path_buf()),
            ..BrokerConfig::default()
        });
        let mut config = Config::default();
        config.server.data_dir = dir.to_string_lossy().into_owned();
        let mqtt = Mqtt::new(broker, &config, Arc::new(ConfigAuth::deny_all()));
        assert!(!mqtt.is_recovered());
        if recover {
            mqtt.recover_state();
            assert!(mqtt.is_recovered());
        }
        mqtt.save_final();
    });
}

/// What the log in `dir` holds.
fn in_log(dir: &Path) -> View {
    let j = Journal::open(Arc::new(FsRoot(dir.to_path_buf())), FsyncPolicy::Never).unwrap();
    let l = j.load().unwrap();
    assert!(l.complete);
    view_of_saved(&l.saved)
}

fn legacy_view(dir: &Path) -> View {
    view_of_saved(&super::legacy::read(&FsRoot(dir.to_path_buf()), dir))
}

#[test]
fn the_844fe42_data_directory_is_migrated_once_and_kept_across_restarts() {
    let d = fixture("once");
    let before = legacy_view(&d);
    // Every kind of item is there: sessions with subscriptions, deliveries in flight (a QoS 2
    // one released) and waiting, an inbound QoS 2 packet id; retained messages.
    let (sessions, retained) = &before;
    assert!(sessions.len() >= 2 && retained.len() >= 3, "{before:?}");
    let items = sessions.values().flat_map(|s| s.3.iter());
    assert!(
        items.clone().any(|i| i.2 != 0 && i.3),
        "a QoS 2 delivery released"
    );
    assert!(
        items.clone().any(|i| i.2 != 0 && !i.3),
        "a delivery in flight"
    );
    assert!(items.clone().any(|i| i.2 == 0), "a waiting delivery");
    assert!(
        sessions
            .values()
            .any(|s| !s.1.is_empty() && !s.2.is_empty())
    );

    start_stop(&d);
    assert_eq!(in_log(&d), before);
    assert!(!d.join(FILE).exists() && !d.join(JOURNAL_DIR).exists());
    assert!(d.join(LEGACY_DIR).join(FILE).is_file());
    assert!(d.join(LEGACY_DIR).join(JOURNAL_DIR).is_dir());
    // Two more starts: no second migration, the same state.
    for _ in 0..2 {
        start_stop(&d);
        assert_eq!(in_log(&d), before);
    }
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn a_migration_cut_before_its_k_is_done_again_and_a_cut_move_finished() {
    let d = fixture("cut");
    let before = legacy_view(&d);
    // A migration's checkpoint cut before its `K`: `C` and a session of nothing.
    {
        let j = Journal::open(Arc::new(FsRoot(d.clone())), FsyncPolicy::Never).unwrap();
        let mut nothing = Saved::default();
        nothing.insert("ghost".into(), super::tests::empty(1));
        let full = snapshot_of(&nothing, 1, 0);
        let cut = Records {
            bytes: full.bytes[..full.ends[1]].to_vec(),
            ends: full.ends[..2].to_vec(),
        };
        j.write_checkpoint(&cut).unwrap();
    }
    start_stop(&d);
    assert_eq!(in_log(&d), before);
    assert!(!d.join(FILE).exists());
    // A move cut short: the old files back beside a complete checkpoint are moved, not read.
    std::fs::copy(Path::new(FIXTURE).join(FILE), d.join(FILE)).unwrap();
    start_stop(&d);
    assert_eq!(in_log(&d), before);
    assert!(!d.join(FILE).exists());
    let _ = std::fs::remove_dir_all(&d);
}

/// A front-end that never recovered takes no checkpoint at its stop: neither over the files
/// of format 1 (not migrated, not moved) nor over the log once migrated.
#[test]
fn a_front_end_never_recovered_leaves_the_saved_state_alone() {
    let d = fixture("unrecovered");
    let before = legacy_view(&d);
    start_stop_recovering(&d, false);
    assert!(d.join(FILE).is_file() && d.join(JOURNAL_DIR).is_dir());
    assert!(!d.join(LEGACY_DIR).exists());
    start_stop(&d);
    assert_eq!(in_log(&d), before);
    start_stop_recovering(&d, false);
    assert_eq!(in_log(&d), before);
    start_stop(&d);
    assert_eq!(in_log(&d), before);
    let _ = std::fs::remove_dir_all(&d);
}
