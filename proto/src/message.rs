//! A whole message: meta plus data frames.

use bytes::Bytes;

use crate::ids::NodeId;
use crate::{Command, Control, Meta};

/// One ps-lite message: the meta frame and the data frames that follow it.
///
/// Data frames are [`Bytes`], so a frame received from ZeroMQ can reach an app,
/// and a buffer an app hands over can reach ZeroMQ, without a copy.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Message {
    /// What the message is and who it is for.
    pub meta: Meta,
    /// The data frames (keys, values, lengths for KV messages).
    pub data: Vec<Bytes>,
}

impl Message {
    /// A control message with command `cmd` to `recver`.
    pub fn control(cmd: Command, recver: NodeId) -> Message {
        let mut msg = Message::default();
        msg.meta.control = Control::new(cmd);
        msg.meta.recver = recver;
        msg
    }

    /// The total size of the data frames in bytes.
    pub fn data_size(&self) -> usize {
        self.data.iter().map(Bytes::len).sum()
    }

    /// Whether this is a control message.
    pub fn is_control(&self) -> bool {
        !self.meta.control.is_empty()
    }
}
