//! The real file system: one directory.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::{Storage, StorageFile};

/// A directory on the local file system (created if missing).
#[derive(Debug, Clone)]
pub struct FsStorage {
    dir: PathBuf,
}

impl FsStorage {
    /// Uses `dir`, creating it and its parents if needed.
    pub fn new(dir: impl AsRef<Path>) -> io::Result<FsStorage> {
        fs::create_dir_all(dir.as_ref())?;
        Ok(FsStorage {
            dir: dir.as_ref().to_path_buf(),
        })
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

#[derive(Debug)]
struct FsFile(File);

impl StorageFile for FsFile {
    fn len(&self) -> io::Result<u64> {
        Ok(self.0.metadata()?.len())
    }
    fn read_at(&self, buf: &mut [u8], pos: u64) -> io::Result<usize> {
        self.0.read_at(buf, pos)
    }
    fn write_at(&self, buf: &[u8], pos: u64) -> io::Result<usize> {
        self.0.write_at(buf, pos)
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.0.set_len(len)
    }
    fn sync_data(&self) -> io::Result<()> {
        self.0.sync_data()
    }
    fn map(&self, pos: u64, len: usize) -> Option<io::Result<bytes::Bytes>> {
        Some(super::map::map(&self.0, pos, len))
    }
}

impl Storage for FsStorage {
    fn list(&self) -> io::Result<Vec<String>> {
        let mut names = Vec::new();
        for e in fs::read_dir(&self.dir)? {
            let e = e?;
            if e.file_type()?.is_file()
                && let Some(n) = e.file_name().to_str()
            {
                names.push(n.to_owned());
            }
        }
        Ok(names)
    }

    fn open(&self, name: &str, create: bool) -> io::Result<Arc<dyn StorageFile>> {
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .create(create)
            .open(self.dir.join(name))?;
        Ok(Arc::new(FsFile(f)))
    }

    fn remove(&self, name: &str) -> io::Result<()> {
        fs::remove_file(self.dir.join(name))
    }

    fn sync_dir(&self) -> io::Result<()> {
        File::open(&self.dir)?.sync_all()
    }
}
