//! The storage root: the data directory as a tree of [`Storage`] directories, so that every
//! durable byte of a broker (its streams, its meta log, the front-ends' logs) goes through
//! one seam that tests can swap for a [`FaultyRoot`] whose crashes hit all of them at once.

use std::collections::BTreeSet;
use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use super::faulty::lock;
use super::{CrashMode, FaultyStorage, FsStorage, Storage, StorageFile};

/// A tree of directories; `rel` paths are `/`-separated and relative to the root.
pub trait Root: Send + Sync + fmt::Debug {
    /// The directory `rel` (created, durably, with its parents if `create`; `NotFound`
    /// otherwise when it is absent).
    fn dir(&self, rel: &str, create: bool) -> io::Result<Arc<dyn Storage>>;
    /// The names of the directories directly under `rel`, sorted (none if it is absent).
    fn list(&self, rel: &str) -> io::Result<Vec<String>>;
    /// Removes `rel` and everything under it, durably (absent: nothing to do).
    fn remove_dir(&self, rel: &str) -> io::Result<()>;
    /// Makes the names directly under the root durable.
    fn sync(&self) -> io::Result<()>;
    /// Where the root is on the local file system, if it is there (the one-time migration of
    /// older data directories reads their files directly).
    fn path(&self) -> Option<&Path> {
        None
    }
}

/// A root on the local file system.
#[derive(Debug, Clone)]
pub struct FsRoot(pub PathBuf);

fn sync_path(p: &Path) -> io::Result<()> {
    std::fs::File::open(p)?.sync_all()
}

impl Root for FsRoot {
    fn dir(&self, rel: &str, create: bool) -> io::Result<Arc<dyn Storage>> {
        let p = self.0.join(rel);
        if !p.is_dir() {
            if !create {
                return Err(io::Error::new(io::ErrorKind::NotFound, rel.to_owned()));
            }
            std::fs::create_dir_all(&p)?;
            // The new names durable, from the directory up to the root.
            let mut at = p.as_path();
            while let Some(parent) = at.parent() {
                sync_path(parent)?;
                if parent == self.0 {
                    break;
                }
                at = parent;
            }
        }
        Ok(Arc::new(FsStorage::new(&p)?))
    }

    fn list(&self, rel: &str) -> io::Result<Vec<String>> {
        let rd = match std::fs::read_dir(self.0.join(rel)) {
            Ok(rd) => rd,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(e),
        };
        let mut names = Vec::new();
        for e in rd {
            let e = e?;
            if e.file_type()?.is_dir()
                && let Some(n) = e.file_name().to_str()
            {
                names.push(n.to_owned());
            }
        }
        names.sort();
        Ok(names)
    }

    fn remove_dir(&self, rel: &str) -> io::Result<()> {
        let p = self.0.join(rel);
        match std::fs::remove_dir_all(&p) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(e),
        }
        match p.parent() {
            Some(parent) => sync_path(parent),
            None => Ok(()),
        }
    }

    fn sync(&self) -> io::Result<()> {
        sync_path(&self.0)
    }

    fn path(&self) -> Option<&Path> {
        Some(&self.0)
    }
}

/// The fault-injecting root: every directory is a view of one [`FaultyStorage`] (file names
/// prefixed with the directory's path), so faults armed on [`FaultyRoot::disk`] and
/// [`FaultyRoot::crash`] apply to all of them at one moment. Directories themselves are
/// durable once created or removed (only file names wait for `sync_dir`). Tests only.
#[derive(Debug, Clone, Default)]
pub struct FaultyRoot {
    disk: FaultyStorage,
    dirs: Arc<Mutex<BTreeSet<String>>>,
}

impl FaultyRoot {
    /// An empty root with no faults armed.
    pub fn new() -> FaultyRoot {
        FaultyRoot::default()
    }

    /// The one storage behind every directory: arm faults on it (full disk, short writes,
    /// failed fsyncs); file names are `<dir>/<name>`.
    pub fn disk(&self) -> &FaultyStorage {
        &self.disk
    }

    /// What a restarted process would find after the given crash of the whole root.
    pub fn crash(&self, mode: CrashMode) -> FaultyRoot {
        let dirs = lock(&self.dirs);
        FaultyRoot {
            disk: self.disk.crash(mode),
            dirs: Arc::new(Mutex::new(dirs.clone())),
        }
    }
}

fn clean(rel: &str) -> String {
    rel.trim_matches('/').to_owned()
}

impl Root for FaultyRoot {
    fn dir(&self, rel: &str, create: bool) -> io::Result<Arc<dyn Storage>> {
        let rel = clean(rel);
        let mut dirs = lock(&self.dirs);
        if !dirs.contains(&rel) {
            if !create {
                return Err(io::Error::new(io::ErrorKind::NotFound, rel));
            }
            let mut at = String::new();
            for part in rel.split('/') {
                if !at.is_empty() {
                    at.push('/');
                }
                at.push_str(part);
                dirs.insert(at.clone());
            }
        }
        Ok(Arc::new(SubDir {
            disk: self.disk.clone(),
            prefix: format!("{rel}/"),
        }))
    }

    fn list(&self, rel: &str) -> io::Result<Vec<String>> {
        let rel = clean(rel);
        let prefix = if rel.is_empty() {
            String::new()
        } else {
            format!("{rel}/")
        };
        Ok(lock(&self.dirs)
            .iter()
            .filter_map(|d| d.strip_prefix(&prefix))
            .filter(|rest| !rest.is_empty() && !rest.contains('/'))
            .map(str::to_owned)
            .collect())
    }

    fn remove_dir(&self, rel: &str) -> io::Result<()> {
        let rel = clean(rel);
        let prefix = format!("{rel}/");
        lock(&self.dirs).retain(|d| *d != rel && !d.starts_with(&prefix));
        self.disk.remove_durably(&prefix);
        Ok(())
    }

    fn sync(&self) -> io::Result<()> {
        Ok(())
    }
}

/// One directory of a [`FaultyRoot`].
#[derive(Debug)]
struct SubDir {
    disk: FaultyStorage,
    prefix: String,
}

impl Storage for SubDir {
    fn list(&self) -> io::Result<Vec<String>> {
        Ok(self
            .disk
            .names()
            .iter()
            .filter_map(|n| n.strip_prefix(&self.prefix))
            .filter(|n| !n.contains('/'))
            .map(str::to_owned)
            .collect())
    }

    fn open(&self, name: &str, create: bool) -> io::Result<Arc<dyn StorageFile>> {
        self.disk.open(&format!("{}{name}", self.prefix), create)
    }

    fn remove(&self, name: &str) -> io::Result<()> {
        self.disk.remove(&format!("{}{name}", self.prefix))
    }

    fn sync_dir(&self) -> io::Result<()> {
        self.disk.sync_names(&self.prefix);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::write_all_at;

    #[test]
    fn a_faulty_root_crashes_every_directory_at_once() {
        let root = FaultyRoot::new();
        let a = root.dir("streams/a", true).unwrap();
        let m = root.dir("meta", true).unwrap();
        let fa = a.open("x", true).unwrap();
        a.sync_dir().unwrap();
        write_all_at(&*fa, b"synced", 0).unwrap();
        fa.sync_data().unwrap();
        write_all_at(&*fa, b"+more", 6).unwrap();
        let fm = m.open("y", true).unwrap(); // name never made durable
        write_all_at(&*fm, b"y", 0).unwrap();
        fm.sync_data().unwrap();
        assert_eq!(root.list("").unwrap(), vec!["meta", "streams"]);
        assert_eq!(root.list("streams").unwrap(), vec!["a"]);

        let killed = root.crash(CrashMode::ProcessKill);
        let ka = killed.dir("streams/a", false).unwrap();
        assert_eq!(ka.list().unwrap(), vec!["x"]);
        assert_eq!(
            killed.disk().contents("streams/a/x").unwrap(),
            b"synced+more"
        );
        assert_eq!(
            killed.dir("meta", false).unwrap().list().unwrap(),
            vec!["y"]
        );

        let lost = root.crash(CrashMode::PowerLoss);
        assert_eq!(lost.disk().contents("streams/a/x").unwrap(), b"synced");
        assert!(lost.dir("meta", false).unwrap().list().unwrap().is_empty());

        root.remove_dir("streams").unwrap();
        assert_eq!(root.list("").unwrap(), vec!["meta"]);
        assert!(root.dir("streams/a", false).is_err());
        let after = root.crash(CrashMode::PowerLoss);
        assert!(after.disk().contents("streams/a/x").is_none());
    }

    #[test]
    fn an_fs_root_makes_and_removes_directories() {
        let d = std::env::temp_dir().join(format!("hayate-root-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        let root = FsRoot(d.clone());
        assert!(root.dir("streams/a", false).is_err());
        let a = root.dir("streams/a", true).unwrap();
        a.open("f", true).unwrap();
        assert_eq!(root.list("streams").unwrap(), vec!["a"]);
        assert!(root.list("nothing").unwrap().is_empty());
        root.remove_dir("streams/a").unwrap();
        root.remove_dir("streams/a").unwrap();
        assert!(root.list("streams").unwrap().is_empty());
        let _ = std::fs::remove_dir_all(&d);
    }
}
