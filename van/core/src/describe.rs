//! One line per message for logs: who to whom, the command or the app's
//! request, the timestamp and the data frames' sizes.

use pslite_proto::Message;

/// A one-line description of a message for logs.
pub fn describe(msg: &Message) -> String {
    use pslite_proto::{Command, K_EMPTY};
    let m = &msg.meta;
    let mut s = format!("{} -> {}", m.sender, m.recver);
    if !m.control.is_empty() {
        s += &format!(" {:?}", m.control.cmd);
        if m.control.cmd == Command::Barrier {
            s += &format!(" group {}", m.control.barrier_group);
        }
        if m.control.node_count() > 0 {
            s += &format!(" {} node(s)", m.control.node_count());
        }
    } else {
        s += &format!(" app {} customer {}", m.app_id, m.customer_id);
        if m.simple_app {
            s += " simple";
        }
        if m.push {
            s += " push";
        }
        if m.pull {
            s += " pull";
        }
        s += &format!(" head {}", m.head);
    }
    s += if m.request { " request" } else { " response" };
    if m.timestamp != K_EMPTY {
        s += &format!(" ts {}", m.timestamp);
    }
    if !msg.data.is_empty() {
        s += &format!(
            " data {:?}",
            msg.data.iter().map(bytes::Bytes::len).collect::<Vec<_>>()
        );
    }
    s
}
