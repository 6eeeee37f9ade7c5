//! Whether the path still names the store file this process opened, and
//! its `-wal` the log it writes. A file replaced under a running gateway
//! (a restore moved over it) or removed takes its lock with it: another
//! process could open the path while this one writes into a file nobody
//! can reach again, and every answer it gave from then on would be
//! forgotten at its restart; a log replaced or removed takes with it the
//! commits not yet copied into the file.
//!
//! Invariant: looked at before a batch commits, at most once per
//! [`EVERY`]; once the path names another file or none, the writer fails
//! every call from then on (the horizon's failure), until a restart opens
//! what the path names.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// How often the path is looked at: a second's writes at most go to a
/// file replaced under them.
const EVERY: Duration = Duration::from_secs(1);

pub(crate) struct Placement {
    path: PathBuf,
    /// The opened file's device and inode.
    file: (u64, u64),
    /// Its write-ahead log (`-wal`), which holds every commit not yet
    /// copied into the file: its device and inode once seen (SQLite makes
    /// it when a connection first reads, and keeps it while one is open).
    wal: (PathBuf, Option<(u64, u64)>),
    looked: Instant,
}

impl Placement {
    /// The file `path` names now, as opened.
    pub(crate) fn of(path: &Path) -> std::io::Result<Placement> {
        let opened = std::fs::metadata(path)?;
        let mut wal = path.as_os_str().to_owned();
        wal.push("-wal");
        let wal = PathBuf::from(wal);
        let seen = std::fs::metadata(&wal).ok().map(|m| (m.dev(), m.ino()));
        Ok(Placement {
            path: path.to_path_buf(),
            file: (opened.dev(), opened.ino()),
            wal: (wal, seen),
            looked: Instant::now(),
        })
    }

    /// Why the path no longer names the file opened, if it does not; `None`
    /// also when it was looked at less than [`EVERY`] before `now`, or
    /// cannot be read for another reason than its absence.
    pub(crate) fn moved(&mut self, now: Instant) -> Option<String> {
        if now.saturating_duration_since(self.looked) < EVERY {
            return None;
        }
        self.looked = now;
        let path = self.path.display();
        match std::fs::metadata(&self.path) {
            Ok(now) if (now.dev(), now.ino()) == self.file => {}
            Ok(_) => {
                return Some(format!(
                    "the store file {path} was replaced under this process (a restore moved over it?): its writes would go to a file no longer at that path, whose lock no longer keeps another process out; restart idemgate on the file now there"
                ));
            }
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
                return Some(format!(
                    "the store file {path} was removed under this process: its writes would go to a file no longer at that path; restart idemgate"
                ));
            }
            Err(_) => return None,
        }
        let (wal, seen) = &mut self.wal;
        let now = match std::fs::metadata(&*wal) {
            Ok(now) => Some((now.dev(), now.ino())),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => None,
            Err(_) => return None,
        };
        match (*seen, now) {
            (None, now) => {
                *seen = now;
                None
            }
            (Some(seen), Some(now)) if seen == now => None,
            (Some(_), _) => Some(format!(
                "the store's log {} was replaced or removed under this process: the commits it holds, not yet in the file, would be lost at the next start; restart idemgate (with the log it wrote, if it can be put back)",
                wal.display()
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_replaced_or_removed_is_seen_once_looked_at() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.db");
        std::fs::write(&path, b"a").unwrap();
        let mut placement = Placement::of(&path).unwrap();
        let later = Instant::now() + EVERY;
        assert_eq!(placement.moved(later), None);
        let copy = dir.path().join("restored.db");
        std::fs::write(&copy, b"a").unwrap();
        std::fs::rename(&copy, &path).unwrap();
        // Not looked at again within a second of the last look.
        assert_eq!(placement.moved(later), None);
        let replaced = placement.moved(later + EVERY).expect("replaced");
        assert!(replaced.contains("replaced"), "{replaced}");
        std::fs::remove_file(&path).unwrap();
        let removed = placement.moved(later + EVERY * 2).expect("removed");
        assert!(removed.contains("removed"), "{removed}");
    }

    #[test]
    fn a_log_removed_or_replaced_once_seen_is_seen() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.db");
        let wal = dir.path().join("s.db-wal");
        std::fs::write(&path, b"a").unwrap();
        let mut placement = Placement::of(&path).unwrap();
        let mut at = Instant::now();
        let mut next = || {
            at += EVERY;
            at
        };
        // No log yet: none to lose; then one, seen.
        assert_eq!(placement.moved(next()), None);
        std::fs::write(&wal, b"log").unwrap();
        assert_eq!(placement.moved(next()), None);
        assert_eq!(placement.moved(next()), None);
        std::fs::remove_file(&wal).unwrap();
        let removed = placement.moved(next()).expect("removed");
        assert!(removed.contains("log"), "{removed}");
    }
}
