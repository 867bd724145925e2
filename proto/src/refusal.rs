//! pslite-only: why a node refused a request ([`Refusal`], `PBMeta` field
//! 120, on a response).
//!
//! A node that cannot take a request (values of another type than its
//! app's, value lengths its app cannot take, no app to take it) answers it
//! at once with a refusal instead of dropping it, so the requester's wait
//! fails in about one round trip with the reason. Nothing of a refused
//! request was applied. Only pslite nodes are sent one: a C++ requester
//! would not know the field (the refusing node logs the refusal instead).

use crate::pb::PbRefusal;
use crate::{DataType, Message, Meta};

/// Why a node refused a request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The request's values are of another type than the app holds.
    DataType {
        /// The app.
        app: i32,
        /// The app's value type.
        held: DataType,
        /// The request's.
        sent: DataType,
    },
    /// The request sent a key another number of values than the app holds
    /// for it.
    Lengths {
        /// The app.
        app: i32,
        /// The first such key.
        key: u64,
        /// Values the app holds for it.
        held: u64,
        /// Values the request sent for it.
        sent: u64,
    },
    /// The node has no such app (customer) to take the request.
    NoApp {
        /// The app the request was for.
        app: i32,
        /// The customer (on a worker; the app id on a server).
        customer: i32,
        /// How long the request waited for it to be created, in ms.
        waited_ms: u64,
    },
    /// The app's own reason, in words (malformed data, a handle's refusal).
    Other {
        /// The app.
        app: i32,
        /// Why.
        reason: String,
    },
}

const DATA_TYPE: i32 = 1;
const LENGTHS: i32 = 2;
const NO_APP: i32 = 3;
const OTHER: i32 = 4;

impl Refusal {
    /// The app the refused request was for.
    pub fn app(&self) -> i32 {
        match self {
            Refusal::DataType { app, .. }
            | Refusal::Lengths { app, .. }
            | Refusal::NoApp { app, .. }
            | Refusal::Other { app, .. } => *app,
        }
    }

    /// The protobuf form.
    pub fn to_pb(&self) -> PbRefusal {
        let mut pb = PbRefusal {
            app: Some(self.app()),
            ..PbRefusal::default()
        };
        match self {
            Refusal::DataType { held, sent, .. } => {
                pb.kind = Some(DATA_TYPE);
                pb.held_type = Some(*held as i32);
                pb.sent_type = Some(*sent as i32);
            }
            Refusal::Lengths {
                key, held, sent, ..
            } => {
                pb.kind = Some(LENGTHS);
                pb.key = Some(*key);
                pb.held_len = Some(*held);
                pb.sent_len = Some(*sent);
            }
            Refusal::NoApp {
                customer,
                waited_ms,
                ..
            } => {
                pb.kind = Some(NO_APP);
                pb.customer = Some(*customer);
                pb.waited_ms = Some(*waited_ms);
            }
            Refusal::Other { reason, .. } => {
                pb.kind = Some(OTHER);
                pb.reason = Some(reason.clone());
            }
        }
        pb
    }

    /// Reads the protobuf form; an unknown kind (a later pslite's) reads
    /// as [`Refusal::Other`] with whatever reason it carries, so a refusal
    /// is never lost.
    pub fn from_pb(pb: PbRefusal) -> Refusal {
        let app = pb.app.unwrap_or(crate::K_EMPTY);
        let data_type = |t: Option<i32>| t.and_then(|t| DataType::try_from(t).ok());
        match pb.kind {
            Some(DATA_TYPE) => match (data_type(pb.held_type), data_type(pb.sent_type)) {
                (Some(held), Some(sent)) => Refusal::DataType { app, held, sent },
                _ => Refusal::Other {
                    app,
                    reason: "the request's values are of another type than the app's".into(),
                },
            },
            Some(LENGTHS) => Refusal::Lengths {
                app,
                key: pb.key.unwrap_or(0),
                held: pb.held_len.unwrap_or(0),
                sent: pb.sent_len.unwrap_or(0),
            },
            Some(NO_APP) => Refusal::NoApp {
                app,
                customer: pb.customer.unwrap_or(app),
                waited_ms: pb.waited_ms.unwrap_or(0),
            },
            _ => Refusal::Other {
                app,
                reason: pb
                    .reason
                    .unwrap_or_else(|| "the request was refused".into()),
            },
        }
    }
}

/// The answer to request `request` that refuses it with `refusal`: the
/// response a successful answer would be (app, customer, timestamp, head
/// and flags echoed, addressed to the requester), without data frames.
pub fn response(request: &Meta, refusal: Refusal) -> Message {
    let mut msg = Message::default();
    let meta = &mut msg.meta;
    meta.app_id = request.app_id;
    meta.customer_id = request.customer_id;
    meta.request = false;
    meta.push = request.push;
    meta.pull = request.pull;
    meta.simple_app = request.simple_app;
    meta.head = request.head;
    meta.timestamp = request.timestamp;
    meta.recver = request.sender;
    meta.refusal = Some(Box::new(refusal));
    msg
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::DataType { app, held, sent } => write!(
                f,
                "app {app} holds {} values and the request sent {} values: use the server's \
                 value type (dtype) on the worker",
                held.name(),
                sent.name()
            ),
            Refusal::Lengths {
                app,
                key,
                held,
                sent,
            } => write!(
                f,
                "app {app} holds {held} values for key {key} and the request sent {sent}: \
                 push as many values per key as the key holds (lens)"
            ),
            Refusal::NoApp {
                app,
                customer,
                waited_ms,
            } => {
                write!(f, "there is no app {app}")?;
                if customer != app {
                    write!(f, " customer {customer}")?;
                }
                write!(
                    f,
                    " (waited {:.1} s for it, PS_APP_WAIT): create it on that node, or use \
                     an app id it has",
                    *waited_ms as f64 / 1000.0
                )
            }
            Refusal::Other { app, reason } => write!(f, "app {app}: {reason}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_round_trips_and_says_what_to_fix() {
        let all = [
            Refusal::DataType {
                app: 0,
                held: DataType::Float,
                sent: DataType::Double,
            },
            Refusal::Lengths {
                app: 3,
                key: 7,
                held: 2,
                sent: 1,
            },
            Refusal::NoApp {
                app: 1,
                customer: 2,
                waited_ms: 1500,
            },
            Refusal::Other {
                app: 0,
                reason: "no".into(),
            },
        ];
        for r in all {
            assert_eq!(Refusal::from_pb(r.to_pb()), r);
        }
        let text = Refusal::DataType {
            app: 0,
            held: DataType::Float,
            sent: DataType::Double,
        }
        .to_string();
        assert!(
            text.contains("float32") && text.contains("float64"),
            "{text}"
        );
        let text = Refusal::Lengths {
            app: 0,
            key: 7,
            held: 2,
            sent: 1,
        }
        .to_string();
        assert!(text.contains("key 7") && text.contains("holds 2") && text.contains("sent 1"));
        // A kind this build does not know is still a refusal.
        let unknown = PbRefusal {
            kind: Some(99),
            app: Some(4),
            reason: Some("later".into()),
            ..PbRefusal::default()
        };
        assert_eq!(
            Refusal::from_pb(unknown),
            Refusal::Other {
                app: 4,
                reason: "later".into()
            }
        );
    }
}
