//! Meta frames captured from C++ ps-lite traffic (hex), as listed in the
//! protocol spec: what a byte-compatible encoder must reproduce and a decoder
//! must accept. Tests and fuzzers start from them.

/// ADD_NODE request of server 127.0.0.1:9092.
pub const ADD_NODE_REQUEST: &str = "08ffffffff071a1e0802121a080010ffffffff071a093132372e302e302e3120844728005000200028003000400050ffffffff0760006800";
/// ADD_NODE reply: server 8 :9092, workers 9 :9093 and 11 :9094, scheduler 1
/// :9091 (whose customer_id 376 is garbage); timestamp 2.
pub const ADD_NODE_REPLY: &str = "08ffffffff071a6308021216080010081a093132372e302e302e31208447280050001216080110091a093132372e302e302e312085472800500012160801100b1a093132372e302e302e31208647280050001217080210011a093132372e302e302e31208347280050f802200028003000400250ffffffff0760006800";
/// BARRIER request, group 7, timestamp 3, customer 0.
pub const BARRIER_REQUEST: &str = "08ffffffff071a040803180720012800300038004003500060006800";
/// BARRIER reply with a garbage group (441436800), timestamp 7.
pub const BARRIER_REPLY: &str = "08ffffffff071a080803188095bfd20120002800300038004007500060006800";
/// TERMINATE (to self).
pub const TERMINATE: &str = "08ffffffff071a020801200028003000500060006800";
/// Push request, head 0, timestamp 3, data types [UINT64, OTHER, INT32].
pub const PUSH_REQUEST: &str = "0800200128013000380040034a03080b03500060006800";
/// Push response, timestamp 1.
pub const PUSH_RESPONSE: &str = "080020002801300038004001500060006800";
/// Pull response, timestamp 6, data types [UINT64, OTHER, INT32].
pub const PULL_RESPONSE: &str = "0800200028003000380040064a03080b03500060016800";
/// SimpleApp response, head 3.
pub const SIMPLE_APP_RESPONSE: &str = "080320002800300138004000500060006800";

/// Every golden frame.
pub const ALL: [&str; 9] = [
    ADD_NODE_REQUEST,
    ADD_NODE_REPLY,
    BARRIER_REQUEST,
    BARRIER_REPLY,
    TERMINATE,
    PUSH_REQUEST,
    PUSH_RESPONSE,
    PULL_RESPONSE,
    SIMPLE_APP_RESPONSE,
];

/// The bytes of a hex string (`None` if it is not hex).
pub fn bytes(hex: &str) -> Option<Vec<u8>> {
    if hex.len() % 2 != 0 {
        return None;
    }
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok())
        .collect()
}
