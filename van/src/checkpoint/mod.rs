//! Checkpoints (`PS_CHECKPOINT_DIR`): the protocol is
//! [`pslite_van_core::checkpoint`]'s (re-exported here); [`disk`] carries
//! out the file operations it asks for.

pub use pslite_van_core::checkpoint::*;

pub mod disk;
