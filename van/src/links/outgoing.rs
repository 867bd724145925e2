//! A message encoded for one link: its meta, its data frames (borrowed
//! until it has to wait, or moved into shared memory for a peer on this
//! host) and its place in the link's queue.

use std::borrow::Cow;

use bytes::Bytes;
use pslite_proto::{Message, NodeId};

use crate::schedule::{PartOf, CONTROL_PRIORITY};
use crate::shm;

/// A message encoded for the wire (its data frames borrowed until it has
/// to wait).
pub(super) struct Outgoing<'a> {
    pub(super) recver: NodeId,
    pub(super) meta: Vec<u8>,
    pub(super) data: Cow<'a, [Bytes]>,
    /// Its frames moved into shared memory, given back if it never leaves.
    pub(super) staged: Option<shm::Staged>,
    /// Queued by the receive thread: counts against the link's budget.
    pub(super) budgeted: bool,
    /// The message it is a part of, if it is one.
    pub(super) part: Option<PartOf>,
    /// Its place in the queue.
    pub(super) priority: i64,
}

impl<'a> Outgoing<'a> {
    /// `msg` encoded for a link whose peer is process `shm_pid` on this
    /// host (0: not on this host): its large frames staged in `pool`'s
    /// shared memory when they may go that way.
    pub(super) fn encode(msg: &'a Message, pool: Option<&shm::Pool>, shm_pid: u32) -> Outgoing<'a> {
        let recver = msg.meta.recver;
        let staged = match pool {
            Some(pool) if shm_pid != 0 => pool.stage(&msg.data, shm_pid),
            _ => None,
        };
        // Control messages go before any data; data by its priority.
        let priority = if msg.meta.control.is_empty() {
            i64::from(msg.meta.priority)
        } else {
            CONTROL_PRIORITY
        };
        let part = match msg.meta.partition.as_deref() {
            Some(p) if msg.meta.control.is_empty() => Some(PartOf {
                message: p.id,
                total: p.total,
            }),
            _ => None,
        };
        match staged {
            Some(mut st) => Outgoing {
                recver,
                meta: msg.meta.encode_with_shm(&st.frames),
                data: Cow::Owned(std::mem::take(&mut st.data)),
                staged: Some(st),
                budgeted: false,
                part,
                priority,
            },
            None => Outgoing {
                recver,
                meta: msg.meta.encode(),
                data: Cow::Borrowed(&msg.data),
                staged: None,
                budgeted: false,
                part,
                priority,
            },
        }
    }

    pub(super) fn into_owned(self) -> Outgoing<'static> {
        Outgoing {
            recver: self.recver,
            meta: self.meta,
            data: Cow::Owned(self.data.into_owned()),
            staged: self.staged,
            budgeted: self.budgeted,
            part: self.part,
            priority: self.priority,
        }
    }

    /// Bytes on the wire (meta and data frames; shared-memory frames are
    /// empty there).
    pub(super) fn bytes(&self) -> usize {
        self.meta.len() + self.data.iter().map(Bytes::len).sum::<usize>()
    }
}
