//! A server's side of compression: its answers compressed as the request
//! asked, with error feedback of its own per worker.

use std::collections::HashMap;
use std::sync::Mutex;

use bytes::Bytes;
use pslite_proto::{lock, DataType, Message};

use super::{as_f32, encode, from_f32, Compression, Encoded, ErrorFeedback, Layout};
use crate::kv_pairs::{Key, Val};

/// Compresses an answer's values as the request asked (`c` from
/// [`Compression::for_answer`]): sets the meta and replaces the values
/// frame, or leaves the meta when it is not worth it. With `feedback` (the
/// residuals of the worker the answer goes to; `c` has error feedback on),
/// each key's residual is added before compressing and what the answer
/// leaves out is kept: `keys` and `lens` are the answer's.
pub(crate) fn compress_answer<V: Val>(
    c: &Compression,
    msg: &mut Message,
    keys: &[Key],
    lens: &[i32],
    feedback: Option<&mut ErrorFeedback>,
) {
    let Some(vals) = msg.data.get(1) else { return };
    let Ok(vals) = crate::sarray::SArray::<V>::from_bytes(vals.clone()) else {
        return;
    };
    let Some(values) = as_f32(&vals) else { return };
    let layout = Layout::of(keys.len(), values.len(), lens);
    let feedback = feedback.filter(|_| c.error_feedback);
    let corrected = feedback
        .as_ref()
        .and_then(|f| f.corrected(keys, layout, &values));
    let to_send: &[f32] = corrected.as_deref().unwrap_or(&values);
    let encoded = encode(c, to_send, c.seed);
    if let Some(f) = feedback {
        let sent = encoded.as_ref().map(Encoded::sent);
        f.keep(keys, layout, to_send, sent.as_deref());
    }
    match encoded {
        Some(e) => {
            let mut m = e.msg;
            m.answer = false;
            m.answer_feedback = false;
            msg.meta.compression = Some(Box::new(m));
            msg.data[1] = Bytes::from(e.payload);
            if let Some(t) = msg.meta.data_type.get_mut(1) {
                *t = DataType::Other;
            }
        }
        // Uncompressed, with the residuals it carries.
        None => {
            if let Some(v) = corrected {
                msg.data[1] = from_f32::<V>(v);
            }
        }
    }
}

/// A server's error feedback on its compressed answers: the residuals of
/// each worker's answers, by worker node id.
#[derive(Default)]
pub(crate) struct AnswerFeedback {
    workers: Mutex<HashMap<pslite_proto::NodeId, ErrorFeedback>>,
}

impl AnswerFeedback {
    /// Compresses `msg`, an answer to worker `worker`, as
    /// [`compress_answer`] does, with that worker's residuals.
    pub(crate) fn compress<V: Val>(
        &self,
        c: &Compression,
        worker: pslite_proto::NodeId,
        msg: &mut Message,
        keys: &[Key],
        lens: &[i32],
    ) {
        if !c.error_feedback {
            return compress_answer::<V>(c, msg, keys, lens, None);
        }
        let mut workers = lock(&self.workers);
        let feedback = workers.entry(worker).or_default();
        compress_answer::<V>(c, msg, keys, lens, Some(feedback));
    }

    /// Worker `worker`'s residual for `key`.
    #[cfg(test)]
    pub(crate) fn residual(&self, worker: pslite_proto::NodeId, key: Key) -> Option<Vec<f32>> {
        lock(&self.workers)
            .get(&worker)
            .and_then(|f| f.residual(key).map(<[f32]>::to_vec))
    }
}
