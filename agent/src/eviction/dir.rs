//! The eviction path's reads of a cgroup's files ([`CgroupBeneath`] is the cgroup engine's):
//! through the descriptor held for the file (`held.rs`) when there is one, else opened beneath
//! the node root, so a process out of descriptors still reads what it holds.

use std::io;

use crate::cgroup::CgroupBeneath;

use super::held;

impl CgroupBeneath {
    /// Reads a whole file: through its held descriptor when there is one, else opened beneath
    /// the node root.
    pub(crate) fn read_held_first(&self, file: &str) -> io::Result<String> {
        match held::read_held(&self.file_display(file)) {
            Some(text) => Ok(text),
            None => self.read_file(file),
        }
    }
}
