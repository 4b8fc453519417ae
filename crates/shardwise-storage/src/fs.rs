//! The filesystem seam: the few calls the WAL makes, behind a trait, so tests can swap the real
//! disk for [`SimFs`] and cut the power at any point.
//!
//! The trait is deliberately small and names the durability steps explicitly:
//! [`AppendFile::sync_data`] makes a file's bytes durable and [`Fs::sync_dir`] makes the
//! directory's entries (created, renamed, removed files) durable. On Linux neither implies the
//! other (reference notes §5.1), and [`SimFs`] enforces exactly that.

mod sim;

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;

pub use sim::SimFs;

/// A file written sequentially from a position: the end of the file when it was opened.
pub trait AppendFile: Send {
    /// Writes all of `data` at the write position and moves it past them (not yet durable).
    /// Bytes already there (such as preallocated zeros) are overwritten.
    fn write_all(&mut self, data: &[u8]) -> io::Result<()>;
    /// Writes zeros from the end of the file up to `len_bytes` (nothing if it is already that
    /// long), without moving the write position; durable with the next `sync_data`. Once those
    /// zeros are durable, overwriting them changes no file size, so a later `fdatasync` has no
    /// metadata to commit: the reason a write-ahead log preallocates (PostgreSQL's WAL segments
    /// are pre-zeroed for the same reason).
    fn preallocate(&mut self, len_bytes: u64) -> io::Result<()>;
    /// `fdatasync`: makes every byte written so far durable. Does not make the file's directory
    /// entry durable; see [`Fs::sync_dir`].
    fn sync_data(&mut self) -> io::Result<()>;
}

/// The filesystem operations the storage layer uses.
pub trait Fs: Send + Sync {
    /// Creates `dir` and its missing parents.
    fn create_dir_all(&self, dir: &Path) -> io::Result<()>;
    /// Creates a new, empty file for appending; fails if `path` exists.
    fn create_append(&self, path: &Path) -> io::Result<Box<dyn AppendFile>>;
    /// Opens an existing file for appending at its end.
    fn open_append(&self, path: &Path) -> io::Result<Box<dyn AppendFile>>;
    /// `fsync` of a directory: makes its entries (creates, renames, removes) durable.
    fn sync_dir(&self, dir: &Path) -> io::Result<()>;
    /// Renames a file, replacing `to` if it exists. Durable only after [`Fs::sync_dir`].
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;
    /// Removes a file. Durable only after [`Fs::sync_dir`].
    fn remove_file(&self, path: &Path) -> io::Result<()>;
    /// The names of the files in `dir`, sorted. Names that are not UTF-8 are left out: nothing
    /// this crate writes has one.
    fn list_dir(&self, dir: &Path) -> io::Result<Vec<String>>;
    /// The whole content of a file.
    fn read(&self, path: &Path) -> io::Result<Vec<u8>>;
    /// Sets a file's length (cutting or zero-extending it). Durable only after a `sync_data`.
    fn truncate(&self, path: &Path, len_bytes: u64) -> io::Result<()>;
}

/// The real filesystem, through `std::fs`.
#[derive(Debug, Clone, Copy, Default)]
pub struct RealFs;

/// Zeros written per call by [`AppendFile::preallocate`] on the real filesystem.
const PREALLOCATE_WRITE_BYTES: usize = 256 * 1024;

/// A file opened for writing (not `O_APPEND`, under which Linux's `pwrite` ignores its offset),
/// with its write position and length tracked here.
struct RealFile {
    file: File,
    pos_bytes: u64,
    len_bytes: u64,
}

impl RealFile {
    fn at_end(file: File) -> io::Result<RealFile> {
        let len_bytes = file.metadata()?.len();
        Ok(RealFile { file, pos_bytes: len_bytes, len_bytes })
    }
}

impl AppendFile for RealFile {
    fn write_all(&mut self, data: &[u8]) -> io::Result<()> {
        self.file.write_all_at(data, self.pos_bytes)?;
        self.pos_bytes += data.len() as u64;
        self.len_bytes = self.len_bytes.max(self.pos_bytes);
        Ok(())
    }

    fn preallocate(&mut self, len_bytes: u64) -> io::Result<()> {
        let zeros = vec![0u8; PREALLOCATE_WRITE_BYTES];
        while self.len_bytes < len_bytes {
            let n = (len_bytes - self.len_bytes).min(PREALLOCATE_WRITE_BYTES as u64) as usize;
            self.file.write_all_at(&zeros[..n], self.len_bytes)?;
            self.len_bytes += n as u64;
        }
        Ok(())
    }

    fn sync_data(&mut self) -> io::Result<()> {
        self.file.sync_data()
    }
}

impl Fs for RealFs {
    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        std::fs::create_dir_all(dir)
    }

    fn create_append(&self, path: &Path) -> io::Result<Box<dyn AppendFile>> {
        let file = OpenOptions::new().write(true).create_new(true).open(path)?;
        Ok(Box::new(RealFile { file, pos_bytes: 0, len_bytes: 0 }))
    }

    fn open_append(&self, path: &Path) -> io::Result<Box<dyn AppendFile>> {
        let file = OpenOptions::new().write(true).open(path)?;
        Ok(Box::new(RealFile::at_end(file)?))
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        File::open(dir)?.sync_all()
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        std::fs::rename(from, to)
    }

    fn remove_file(&self, path: &Path) -> io::Result<()> {
        std::fs::remove_file(path)
    }

    fn list_dir(&self, dir: &Path) -> io::Result<Vec<String>> {
        let mut names = Vec::new();
        for entry in std::fs::read_dir(dir)? {
            if let Ok(name) = entry?.file_name().into_string() {
                names.push(name);
            }
        }
        names.sort();
        Ok(names)
    }

    fn read(&self, path: &Path) -> io::Result<Vec<u8>> {
        std::fs::read(path)
    }

    fn truncate(&self, path: &Path, len_bytes: u64) -> io::Result<()> {
        OpenOptions::new().write(true).open(path)?.set_len(len_bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn real_fs_appends_lists_renames_truncates_and_removes() -> io::Result<()> {
        let tmp = tempfile::tempdir()?;
        let dir = tmp.path().join("d");
        let fs = RealFs;
        fs.create_dir_all(&dir)?;
        let a = dir.join("a");
        let mut file = fs.create_append(&a)?;
        file.write_all(b"hello ")?;
        file.sync_data()?;
        assert!(fs.create_append(&a).is_err(), "create_append must not clobber");
        let mut again = fs.open_append(&a)?;
        again.write_all(b"world")?;
        again.sync_data()?;
        fs.sync_dir(&dir)?;
        assert_eq!(fs.read(&a)?, b"hello world");
        fs.truncate(&a, 5)?;
        assert_eq!(fs.read(&a)?, b"hello");
        // Preallocated zeros are overwritten by later writes; the write position does not move.
        let mut pre = fs.open_append(&a)?;
        pre.preallocate(12)?;
        pre.preallocate(8)?; // already longer: nothing
        assert_eq!(fs.read(&a)?, b"hello\0\0\0\0\0\0\0");
        pre.write_all(b", w")?;
        pre.sync_data()?;
        assert_eq!(fs.read(&a)?, b"hello, w\0\0\0\0");
        fs.truncate(&a, 5)?;
        let b = dir.join("b");
        fs.rename(&a, &b)?;
        assert_eq!(fs.list_dir(&dir)?, vec!["b".to_string()]);
        fs.remove_file(&b)?;
        assert!(fs.list_dir(&dir)?.is_empty());
        Ok(())
    }
}
