//! An in-memory [`Storage`] that fails on purpose: a full disk part-way through a write,
//! short writes, failed fsyncs, and crashes that keep what a process kill or a power loss
//! would keep (torn and garbage tails included). Tests only; nothing here is fast.

use std::collections::BTreeMap;
use std::io;
use std::sync::{Arc, Mutex, MutexGuard};

use super::{Storage, StorageFile};

/// What survives [`FaultyStorage::crash`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CrashMode {
    /// The process died (`kill -9`): the page cache survives, so everything written does.
    ProcessKill,
    /// The machine lost power: only synced data, and only names made durable by `sync_dir`.
    PowerLoss,
    /// A power loss in which part of the unsynced appended data reached the disk, followed by
    /// garbage; `seed` picks how much of each.
    TornPowerLoss {
        /// Seeds the choice of kept lengths and garbage bytes.
        seed: u64,
    },
}

#[derive(Debug, Default, Clone)]
struct MemFile {
    data: Vec<u8>,
    synced: Vec<u8>,
}

#[derive(Debug, Default)]
struct State {
    files: BTreeMap<String, Arc<Mutex<MemFile>>>,
    /// Names as of the last `sync_dir`, with the file they named then.
    durable: BTreeMap<String, Arc<Mutex<MemFile>>>,
    /// Bytes that may still be written before writes fail with "no space".
    space: Option<u64>,
    /// Every write stores at most half of what it is given.
    short_writes: bool,
    /// This many coming `sync_data` calls fail.
    failing_syncs: u32,
    writes: u64,
    syncs: u64,
}

/// The fault-injecting storage. Clones share one directory.
#[derive(Debug, Clone, Default)]
pub struct FaultyStorage {
    state: Arc<Mutex<State>>,
}

pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        // xorshift64*; never zero.
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.next() % n }
    }
}

impl FaultyStorage {
    /// An empty directory with no faults armed.
    pub fn new() -> FaultyStorage {
        FaultyStorage::default()
    }

    /// Writes fail with "no space" once `bytes` more bytes have been written; the write that
    /// crosses the limit is short.
    pub fn fail_writes_after(&self, bytes: u64) {
        lock(&self.state).space = Some(bytes);
    }

    /// Lifts the "no space" limit.
    pub fn clear_write_faults(&self) {
        lock(&self.state).space = None;
    }

    /// Makes every write store at most half of its buffer (at least one byte).
    pub fn short_writes(&self, on: bool) {
        lock(&self.state).short_writes = on;
    }

    /// Makes the next `n` calls of `sync_data` fail.
    pub fn fail_syncs(&self, n: u32) {
        lock(&self.state).failing_syncs = n;
    }

    /// Calls of `write_at` so far.
    pub fn writes(&self) -> u64 {
        lock(&self.state).writes
    }

    /// Successful calls of `sync_data` so far.
    pub fn syncs(&self) -> u64 {
        lock(&self.state).syncs
    }

    /// The names in the directory, sorted.
    pub fn names(&self) -> Vec<String> {
        lock(&self.state).files.keys().cloned().collect()
    }

    /// A copy of the bytes of `name`.
    pub fn contents(&self, name: &str) -> Option<Vec<u8>> {
        lock(&self.state)
            .files
            .get(name)
            .map(|f| lock(f).data.clone())
    }

    /// Replaces the bytes of `name` (creating it, synced), as a test that damages files does.
    pub fn set_contents(&self, name: &str, bytes: Vec<u8>) {
        let f = Arc::new(Mutex::new(MemFile {
            data: bytes.clone(),
            synced: bytes,
        }));
        let mut st = lock(&self.state);
        st.files.insert(name.to_owned(), f.clone());
        st.durable.insert(name.to_owned(), f);
    }

    /// Makes durable the names that start with `prefix` and have no `/` after it (a
    /// directory of a [`super::FaultyRoot`]).
    pub(crate) fn sync_names(&self, prefix: &str) {
        let mut st = lock(&self.state);
        let ours = |n: &String| n.strip_prefix(prefix).is_some_and(|r| !r.contains('/'));
        st.durable.retain(|n, _| !ours(n));
        let keep: Vec<_> = st
            .files
            .iter()
            .filter(|(n, _)| ours(n))
            .map(|(n, f)| (n.clone(), f.clone()))
            .collect();
        st.durable.extend(keep);
    }

    /// Removes every name that starts with `prefix`, durably.
    pub(crate) fn remove_durably(&self, prefix: &str) {
        let mut st = lock(&self.state);
        st.files.retain(|n, _| !n.starts_with(prefix));
        st.durable.retain(|n, _| !n.starts_with(prefix));
    }

    /// What a restarted process would find after the given crash. Faults are not carried over.
    pub fn crash(&self, mode: CrashMode) -> FaultyStorage {
        let st = lock(&self.state);
        let mut rng = Rng(match mode {
            CrashMode::TornPowerLoss { seed } => seed | 1,
            _ => 1,
        });
        let mut files = BTreeMap::new();
        let names: Vec<(&String, &Arc<Mutex<MemFile>>)> = match mode {
            CrashMode::ProcessKill => st.files.iter().collect(),
            _ => st.durable.iter().collect(),
        };
        for (name, f) in names {
            let f = lock(f);
            let data = match mode {
                CrashMode::ProcessKill => f.data.clone(),
                CrashMode::PowerLoss => f.synced.clone(),
                CrashMode::TornPowerLoss { .. } => {
                    let mut d = f.synced.clone();
                    if f.data.len() > d.len() && f.data.starts_with(&d) {
                        let extra = (f.data.len() - d.len()) as u64;
                        let keep = rng.below(extra + 1) as usize;
                        d.extend_from_slice(&f.data[f.synced.len()..f.synced.len() + keep]);
                        if keep < extra as usize && rng.below(2) == 1 {
                            for _ in 0..rng.below(64) {
                                d.push(rng.next() as u8);
                            }
                        }
                    }
                    d
                }
            };
            let mf = MemFile {
                data: data.clone(),
                synced: data,
            };
            files.insert(name.clone(), Arc::new(Mutex::new(mf)));
        }
        let durable = files.clone();
        FaultyStorage {
            state: Arc::new(Mutex::new(State {
                files,
                durable,
                ..State::default()
            })),
        }
    }
}

#[derive(Debug)]
struct FaultyFile {
    file: Arc<Mutex<MemFile>>,
    state: Arc<Mutex<State>>,
}

impl StorageFile for FaultyFile {
    fn len(&self) -> io::Result<u64> {
        Ok(lock(&self.file).data.len() as u64)
    }

    fn read_at(&self, buf: &mut [u8], pos: u64) -> io::Result<usize> {
        let f = lock(&self.file);
        let Ok(pos) = usize::try_from(pos) else {
            return Ok(0);
        };
        if pos >= f.data.len() {
            return Ok(0);
        }
        let n = buf.len().min(f.data.len() - pos);
        buf[..n].copy_from_slice(&f.data[pos..pos + n]);
        Ok(n)
    }

    fn write_at(&self, buf: &[u8], pos: u64) -> io::Result<usize> {
        let mut n = buf.len();
        {
            let mut st = lock(&self.state);
            st.writes += 1;
            if st.short_writes && n > 1 {
                n /= 2;
            }
            if let Some(space) = st.space.as_mut() {
                if *space == 0 {
                    return Err(io::Error::new(
                        io::ErrorKind::StorageFull,
                        "injected: no space",
                    ));
                }
                n = n.min(usize::try_from(*space).unwrap_or(usize::MAX));
                *space -= n as u64;
            }
        }
        let mut f = lock(&self.file);
        let pos = usize::try_from(pos).map_err(|_| io::Error::other("position too large"))?;
        if f.data.len() < pos + n {
            f.data.resize(pos + n, 0);
        }
        f.data[pos..pos + n].copy_from_slice(&buf[..n]);
        Ok(n)
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        let len = usize::try_from(len).map_err(|_| io::Error::other("length too large"))?;
        lock(&self.file).data.resize(len, 0);
        Ok(())
    }

    fn sync_data(&self) -> io::Result<()> {
        {
            let mut st = lock(&self.state);
            if st.failing_syncs > 0 {
                st.failing_syncs -= 1;
                return Err(io::Error::other("injected: fsync failed"));
            }
            st.syncs += 1;
        }
        let mut f = lock(&self.file);
        f.synced = f.data.clone();
        Ok(())
    }
}

impl Storage for FaultyStorage {
    fn list(&self) -> io::Result<Vec<String>> {
        Ok(self.names())
    }

    fn open(&self, name: &str, create: bool) -> io::Result<Arc<dyn StorageFile>> {
        let mut st = lock(&self.state);
        let file = match st.files.get(name) {
            Some(f) => f.clone(),
            None if create => {
                let f = Arc::new(Mutex::new(MemFile::default()));
                st.files.insert(name.to_owned(), f.clone());
                f
            }
            None => return Err(io::Error::new(io::ErrorKind::NotFound, name.to_owned())),
        };
        Ok(Arc::new(FaultyFile {
            file,
            state: self.state.clone(),
        }))
    }

    fn remove(&self, name: &str) -> io::Result<()> {
        match lock(&self.state).files.remove(name) {
            Some(_) => Ok(()),
            None => Err(io::Error::new(io::ErrorKind::NotFound, name.to_owned())),
        }
    }

    fn sync_dir(&self) -> io::Result<()> {
        let mut st = lock(&self.state);
        st.durable = st.files.clone();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::{read_full_at, write_all_at};

    #[test]
    fn power_loss_keeps_synced_data_and_durable_names_only() {
        let s = FaultyStorage::new();
        let a = s.open("a", true).unwrap();
        s.sync_dir().unwrap();
        write_all_at(&*a, b"hello", 0).unwrap();
        a.sync_data().unwrap();
        write_all_at(&*a, b" world", 5).unwrap();
        let b = s.open("b", true).unwrap();
        write_all_at(&*b, b"x", 0).unwrap();
        b.sync_data().unwrap();

        let killed = s.crash(CrashMode::ProcessKill);
        assert_eq!(killed.contents("a").unwrap(), b"hello world");
        assert_eq!(killed.contents("b").unwrap(), b"x");

        let lost = s.crash(CrashMode::PowerLoss);
        assert_eq!(lost.contents("a").unwrap(), b"hello");
        assert_eq!(
            lost.names(),
            vec!["a".to_owned()],
            "b was never made durable by sync_dir"
        );

        for seed in 0..50 {
            let torn = s
                .crash(CrashMode::TornPowerLoss { seed })
                .contents("a")
                .unwrap();
            assert!(torn.starts_with(b"hello"));
        }
    }

    #[test]
    fn disk_full_gives_a_short_write_then_errors_and_failed_syncs_keep_data_unsynced() {
        let s = FaultyStorage::new();
        let f = s.open("f", true).unwrap();
        s.fail_writes_after(3);
        assert_eq!(f.write_at(b"abcdef", 0).unwrap(), 3);
        assert_eq!(
            f.write_at(b"def", 3).unwrap_err().kind(),
            io::ErrorKind::StorageFull
        );
        s.clear_write_faults();
        s.fail_syncs(1);
        assert!(f.sync_data().is_err());
        assert_eq!(s.crash(CrashMode::PowerLoss).names(), Vec::<String>::new());
        s.sync_dir().unwrap();
        assert_eq!(s.crash(CrashMode::PowerLoss).contents("f").unwrap(), b"");
        f.sync_data().unwrap();
        assert_eq!(s.crash(CrashMode::PowerLoss).contents("f").unwrap(), b"abc");
        let mut buf = [0u8; 8];
        assert_eq!(read_full_at(&*f, &mut buf, 1).unwrap(), 2);
    }
}
