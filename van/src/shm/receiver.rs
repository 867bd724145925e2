//! A receiver's side: its peers' segments opened and mapped once, each
//! received descriptor checked and claimed, the frame handed on as a
//! [`Bytes`] over the mapping.

use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use pslite_proto::shm::ShmFrame;
use pslite_proto::NodeId;

use super::host::is_gone;
use super::mapping::{Mapping, HEADER, MAGIC};
use super::pool::MAX_CAPACITY;
use super::slot::{claim, release};
use super::track::register_foreign;
use super::{ShmError, NAME_PREFIX};

/// Mappings a receiver keeps at most (older ones are dropped beyond it).
const MAX_MAPPINGS: usize = 4096;

/// A claimed frame in a peer's segment; dropping it releases the claim.
struct View {
    map: Arc<Mapping>,
    slot: usize,
    generation: u32,
    offset: usize,
    len: usize,
}

impl AsRef<[u8]> for View {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: bounds were checked against the mapping at claim time, and
        // the sender leaves the content alone while a slot counts a view.
        unsafe { std::slice::from_raw_parts(self.map.data().add(self.offset), self.len) }
    }
}

impl Drop for View {
    fn drop(&mut self) {
        release(&self.map, self.slot, self.generation);
    }
}

/// A receiver's mappings of its peers' segments (owned by the receive thread).
pub struct Receiver {
    /// By (sender, fd, token): the sender's pid and the mapping.
    pub(super) maps: HashMap<(NodeId, i32, u64), (u32, Arc<Mapping>)>,
    pruned: Option<Instant>,
    /// This process: the slot of a segment this receiver claims in.
    pub(super) me: u32,
}

impl Default for Receiver {
    fn default() -> Receiver {
        Receiver::new()
    }
}

impl Receiver {
    /// A receiver with no mappings.
    pub fn new() -> Receiver {
        Receiver {
            maps: HashMap::new(),
            pruned: None,
            me: std::process::id(),
        }
    }

    /// How many peer segments are mapped.
    pub fn mapped(&self) -> usize {
        self.maps.len()
    }

    /// Replaces the frames `descs` name in `data` by views of `sender`'s
    /// segments (`pid`: its process, from the node table; `None` if it is
    /// not a same-host shared-memory peer); returns their bytes. On any
    /// error nothing is claimed and `data` is unchanged.
    pub fn resolve(
        &mut self,
        sender: NodeId,
        pid: Option<u32>,
        descs: &[ShmFrame],
        data: &mut [Bytes],
    ) -> Result<usize, ShmError> {
        let pid = pid.ok_or(ShmError::NotShmPeer)?;
        let mut seen = vec![false; data.len()];
        for d in descs {
            let i = d.index as usize;
            if i >= data.len() || seen[i] || !data[i].is_empty() {
                return Err(ShmError::BadIndex(d.index));
            }
            seen[i] = true;
        }
        let mut views = Vec::with_capacity(descs.len());
        for d in descs {
            let map = self.mapping(sender, pid, d)?;
            let capacity = map.capacity() as u64;
            let fits = d.length > 0
                && d.offset
                    .checked_add(d.length)
                    .is_some_and(|end| end <= capacity);
            if !fits {
                return Err(ShmError::OutOfBounds {
                    offset: d.offset,
                    length: d.length,
                    capacity,
                });
            }
            let gen = match u32::try_from(d.generation) {
                Ok(g) if g > 0 => g,
                _ => return Err(ShmError::WrongGeneration(d.generation)),
            };
            let slot = map.slot_of(self.me).ok_or(ShmError::NotAddressed)?;
            if !claim(&map, slot, gen) {
                // Views claimed so far are dropped with `views`: released.
                return Err(ShmError::WrongGeneration(d.generation));
            }
            views.push((
                d.index as usize,
                View {
                    map,
                    slot,
                    generation: gen,
                    offset: d.offset as usize,
                    len: d.length as usize,
                },
            ));
        }
        let mut bytes = 0;
        for (i, view) in views {
            bytes += view.len;
            data[i] = Bytes::from_owner(view);
        }
        Ok(bytes)
    }

    /// The mapping of the segment `d` names, opened on first use.
    fn mapping(
        &mut self,
        sender: NodeId,
        pid: u32,
        d: &ShmFrame,
    ) -> Result<Arc<Mapping>, ShmError> {
        let key = (sender, d.fd, d.token);
        if let Some((p, map)) = self.maps.get(&key) {
            if *p == pid {
                return Ok(Arc::clone(map));
            }
        }
        // A restarted sender (new pid) or a new segment.
        self.maps
            .retain(|(s, _, _), (p, _)| *s != sender || *p == pid);
        if self.maps.len() >= MAX_MAPPINGS {
            self.maps.clear();
        }
        let map = Arc::new(open_segment(pid, d.fd)?);
        if map.token() != d.token {
            return Err(ShmError::WrongToken);
        }
        self.maps.insert(key, (pid, Arc::clone(&map)));
        Ok(map)
    }

    /// Forgets the mappings of processes that are gone (at most once a
    /// second), so a killed sender's segments are freed.
    pub fn prune(&mut self, now: Instant) {
        if self
            .pruned
            .is_some_and(|t| now.duration_since(t) < Duration::from_secs(1))
        {
            return;
        }
        self.pruned = Some(now);
        let before = self.maps.len();
        self.maps.retain(|_, (pid, map)| {
            let live = !is_gone(*pid);
            if !live {
                // Copies of its frames a pool of this process keeps are let
                // go (see `Segment::is_stale`), so the mapping can go.
                if let Some(registration) = map.foreign() {
                    registration.invalidate();
                }
            }
            live
        });
        if self.maps.len() != before {
            log::debug!(
                "shared memory: unmapped {} segments of processes that are gone",
                before - self.maps.len()
            );
        }
    }
}

/// Opens and maps process `pid`'s segment `fd`, checking it is one. The
/// descriptor opened is closed again before this returns: a mapping needs
/// none.
fn open_segment(pid: u32, fd: i32) -> Result<Mapping, ShmError> {
    if fd < 0 {
        return Err(ShmError::BadFd(fd));
    }
    let path = format!("/proc/{pid}/fd/{fd}");
    let open_err = |source| ShmError::Open {
        path: path.clone(),
        source,
    };
    let target = std::fs::read_link(&path).map_err(open_err)?;
    let target = target.to_string_lossy();
    if !target.starts_with(&format!("/memfd:{NAME_PREFIX}")) {
        return Err(ShmError::NotASegment {
            path,
            target: target.into_owned(),
        });
    }
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .map_err(open_err)?;
    let meta = file.metadata().map_err(open_err)?;
    let len = usize::try_from(meta.len()).unwrap_or(usize::MAX);
    if !meta.file_type().is_file() || len <= HEADER || len > HEADER + MAX_CAPACITY {
        return Err(ShmError::BadSize { path, len });
    }
    let fd = OwnedFd::from(file);
    let mut map = Mapping::new(&fd, len).map_err(open_err)?;
    drop(fd);
    if map.magic() != MAGIC || map.stated_capacity() != map.capacity() as u64 {
        return Err(ShmError::NoHeader { path });
    }
    let (start, end) = map.range();
    map.set_foreign(register_foreign(start, end));
    Ok(map)
}
