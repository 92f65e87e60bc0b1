//! The process's exit statuses, all in one table (sysexits.h, as daemons use them). Each error
//! type's `exit_code` maps onto these; docs/usage.md lists them for operators.
//!
//! | status | constant | when |
//! |---:|---|---|
//! | 0 | | stopped on a signal |
//! | 1 | [`PROBLEMS`] | `validate`, `plan`, `recommend-reserved`: the input or an option is not valid |
//! | 2 | [`UNREADABLE`] | `validate`, `plan`, `recommend-reserved`: the input could not be read |
//! | 64 | [`CONFIG`] | a configuration or usage error (the file and field are named) |
//! | 69 | [`UNAVAILABLE`] | a service is unavailable: the port is taken, another qoslet runs on the node root, the API server or the kubelet's `/configz` cannot be read at start |
//! | 71 | [`OSERR`] | the kernel refused: a cgroup cannot be opened or created, a directory cannot be watched, the write queue's directory cannot be opened |
//! | 72 | [`OSFILE`] | a system file is missing: no cgroup hierarchy is mounted, or the layout cannot be detected |

/// The commands that read input: it, or an option, is not valid.
pub(crate) const PROBLEMS: u8 = 1;
/// The commands that read input: it could not be read.
pub(crate) const UNREADABLE: u8 = 2;
/// EX_USAGE / EX_CONFIG: a configuration or usage error.
pub(crate) const CONFIG: u8 = 64;
/// EX_UNAVAILABLE: a service is unavailable.
pub(crate) const UNAVAILABLE: u8 = 69;
/// EX_OSERR: an operating system error.
pub(crate) const OSERR: u8 = 71;
/// EX_OSFILE: a system file is missing.
pub(crate) const OSFILE: u8 = 72;
