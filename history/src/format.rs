//! The history file: JSON Lines, a header line then one operation per line.
//!
//! ```text
//! {"format":"shakedown-history","version":1,"model":"etcd"}
//! {"client":0,"member":"m1","call":1200,"return":1850,"type":"txn","key":"/o/3","if_mod_revision":0,"then":{"put":"c0-1"},"answer":{"succeeded":true,"revision":7}}
//! {"client":1,"call":1300,"return":1400,"type":"get","key":"/o/3","answer":{"revision":7,"kv":{"value":"c0-1","mod_revision":7}}}
//! {"client":2,"call":1310,"return":null,"type":"put","key":"/o/4","value":"c2-9","answer":null}
//! ```
//!
//! - `call` and `return` are microseconds on one monotonic clock shared by every client. An
//!   operation with no `answer` (it timed out, its connection was lost, the run ended while it
//!   was in flight) has an unknown outcome: it may have taken effect at any instant after its
//!   call, or never; its `return` is ignored.
//! - `epoch` (default 0) counts restores from a backup: each epoch is judged on its own, and
//!   every epoch after the first starts from a store the history does not describe (each key's
//!   first answer in it says what it held).
//! - `member` names who answered (the endpoint's backend, the member a client is connected to),
//!   for the verdict to name.
//! - `group` (absent: none) ties together the lines of one request over several keys: etcd's
//!   range, delete-range and multi-key transactions are recorded as one line per key they read or
//!   wrote (each projection of an atomic request must be explained on its own), with the same
//!   call, return, client and group; the writes of one group share one revision.
//! - Models: `etcd` (etcd's key-value API: get, put, delete, a transaction guarded by one key's
//!   mod revision, and a read of a key's state at a given revision) and `register` (read, write and compare-and-set of registers named by an
//!   optional `key`, the simplest histories other tools record).

use serde::{Deserialize, Serialize};

/// The first line of a history file.
pub const FORMAT: &str = "shakedown-history";
/// The version of the format this crate writes and reads.
pub const VERSION: u32 = 1;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ModelKind {
    Etcd,
    Register,
}

impl std::fmt::Display for ModelKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ModelKind::Etcd => "etcd",
            ModelKind::Register => "register",
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Header {
    pub format: String,
    pub version: u32,
    pub model: ModelKind,
}

impl Header {
    pub fn new(model: ModelKind) -> Header {
        Header { format: FORMAT.into(), version: VERSION, model }
    }
}

/// One request of one client and what it got.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Operation {
    pub client: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub member: Option<String>,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub epoch: u32,
    /// The request over several keys this line is one key's part of (its writes share one
    /// revision); `None` for a request of one key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<u64>,
    /// When the request was sent (µs).
    pub call: u64,
    /// When its answer arrived (µs); ignored when there is no answer.
    #[serde(rename = "return")]
    pub ret: Option<u64>,
    #[serde(flatten)]
    pub request: Request,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// A register value: a number or a string.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Scalar {
    Int(i64),
    Str(String),
}

impl std::fmt::Display for Scalar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Scalar::Int(n) => write!(f, "{n}"),
            Scalar::Str(s) => write!(f, "{s:?}"),
        }
    }
}

/// A request with its answer (`None`: unknown outcome).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "kebab-case")]
pub enum Request {
    /// etcd: a range of one key. `serializable` reads may be answered by any member from its
    /// own store and are not part of the linearizability check.
    Get {
        key: String,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        serializable: bool,
        answer: Option<ReadAnswer>,
    },
    /// etcd: a key's state at revision `at`, as a read at that revision answered it (a range
    /// with an explicit revision, a transaction's read of the keys it compares before its own
    /// write, a keys-only or serializable range): exactly the state the key's writes leave at
    /// `at`, whoever answered and whenever. With `keys_only` the answer's value is not known
    /// (the key's presence, mod revision, create revision and version are).
    GetAt {
        key: String,
        at: i64,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        keys_only: bool,
        answer: Option<ReadAnswer>,
    },
    /// etcd: a put of one key.
    Put { key: String, value: String, answer: Option<WriteAnswer> },
    /// etcd: a delete of one key.
    Delete { key: String, answer: Option<DeleteAnswer> },
    /// etcd: `If(ModRevision(key) == if_mod_revision) Then(then) Else(Get(key))`.
    Txn { key: String, if_mod_revision: i64, then: Then, answer: Option<TxnAnswer> },
    /// register: read.
    Read {
        #[serde(default)]
        key: String,
        answer: Option<RegisterRead>,
    },
    /// register: write.
    Write {
        #[serde(default)]
        key: String,
        value: Scalar,
        answer: Option<Done>,
    },
    /// register: compare-and-set.
    Cas {
        #[serde(default)]
        key: String,
        from: Scalar,
        to: Scalar,
        answer: Option<CasAnswer>,
    },
}

impl Request {
    pub fn key(&self) -> &str {
        match self {
            Request::Get { key, .. }
            | Request::GetAt { key, .. }
            | Request::Put { key, .. }
            | Request::Delete { key, .. }
            | Request::Txn { key, .. }
            | Request::Read { key, .. }
            | Request::Write { key, .. }
            | Request::Cas { key, .. } => key,
        }
    }

    /// Whether the request is judged against the key's state at the revision it claims rather
    /// than by the linearizability search: a serializable get, a get at a revision.
    pub fn at_claimed_revision(&self) -> bool {
        matches!(self, Request::Get { serializable: true, .. } | Request::GetAt { .. })
    }

    /// Whether the request has an answer.
    pub fn answered(&self) -> bool {
        match self {
            Request::Get { answer, .. } | Request::GetAt { answer, .. } => answer.is_some(),
            Request::Put { answer, .. } => answer.is_some(),
            Request::Delete { answer, .. } => answer.is_some(),
            Request::Txn { answer, .. } => answer.is_some(),
            Request::Read { answer, .. } => answer.is_some(),
            Request::Write { answer, .. } => answer.is_some(),
            Request::Cas { answer, .. } => answer.is_some(),
        }
    }

    /// The model this request belongs to.
    pub fn model(&self) -> ModelKind {
        match self {
            Request::Get { .. } | Request::GetAt { .. } | Request::Put { .. } | Request::Delete { .. } | Request::Txn { .. } => {
                ModelKind::Etcd
            }
            Request::Read { .. } | Request::Write { .. } | Request::Cas { .. } => ModelKind::Register,
        }
    }
}

/// A key's value as etcd answered it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Kv {
    pub value: String,
    pub mod_revision: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub create_revision: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<i64>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReadAnswer {
    /// The header's revision: the store's revision the read was answered at.
    pub revision: i64,
    pub kv: Option<Kv>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WriteAnswer {
    pub revision: i64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeleteAnswer {
    pub revision: i64,
    pub deleted: i64,
}

/// What a transaction does when its compare holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub enum Then {
    Put(String),
    Delete,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TxnAnswer {
    pub succeeded: bool,
    /// The header's revision (the write's revision when it succeeded and changed the store).
    pub revision: i64,
    /// The `Else` branch's read (when `succeeded` is false).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv: Option<Kv>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RegisterRead {
    pub value: Option<Scalar>,
}

/// An answer that carries nothing but "done".
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Done {}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CasAnswer {
    pub ok: bool,
}

/// A history: its model and its operations.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct History {
    pub model: ModelKind,
    pub ops: Vec<Operation>,
}

/// Why a history file could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ParseError {
    #[error("the history is empty: its first line must be the header {{\"format\":\"{FORMAT}\",\"version\":{VERSION},\"model\":\"etcd\"|\"register\"}}")]
    Empty,
    #[error(
        "line 1: not a history header ({0}); expected {{\"format\":\"{FORMAT}\",\"version\":{VERSION},\"model\":\"etcd\"|\"register\"}}"
    )]
    Header(String),
    #[error("line 1: format {found:?} is not {FORMAT:?}")]
    Format { found: String },
    #[error("line 1: version {found} is not supported (this shakedown reads version {VERSION})")]
    Version { found: u32 },
    #[error("line {line}: {error}")]
    Operation { line: usize, error: String },
    #[error("line {line}: a {found} operation in a history of model {model}")]
    WrongModel { line: usize, found: ModelKind, model: ModelKind },
    #[error("line {line}: return {ret} is before call {call}")]
    Time { line: usize, call: u64, ret: u64 },
}

impl History {
    /// Reads a history file's text.
    pub fn parse(text: &str) -> Result<History, ParseError> {
        let mut lines = text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty());
        let (_, first) = lines.next().ok_or(ParseError::Empty)?;
        let header: Header = serde_json::from_str(first).map_err(|e| ParseError::Header(e.to_string()))?;
        if header.format != FORMAT {
            return Err(ParseError::Format { found: header.format });
        }
        if header.version != VERSION {
            return Err(ParseError::Version { found: header.version });
        }
        let mut ops = Vec::new();
        for (i, line) in lines {
            let op: Operation = serde_json::from_str(line).map_err(|e| ParseError::Operation { line: i + 1, error: e.to_string() })?;
            strict(i + 1, line, &op)?;
            if op.request.model() != header.model {
                return Err(ParseError::WrongModel { line: i + 1, found: op.request.model(), model: header.model });
            }
            if let Some(ret) = op.ret.filter(|&r| r < op.call) {
                return Err(ParseError::Time { line: i + 1, call: op.call, ret });
            }
            ops.push(op);
        }
        Ok(History { model: header.model, ops })
    }

    /// The history as a file's text.
    pub fn to_jsonl(&self) -> String {
        let mut out = serde_json::to_string(&Header::new(self.model)).expect("a header serialises");
        out.push('\n');
        for op in &self.ops {
            out.push_str(&serde_json::to_string(op).expect("an operation serialises"));
            out.push('\n');
        }
        out
    }
}

/// serde cannot refuse unknown fields of a flattened struct: a misspelt field would be dropped
/// and a misspelt `answer` read as "no answer". The line's fields must be the operation's own
/// (those left out when written at their default aside), and `answer` must be there, `null`
/// when the outcome is unknown.
fn strict(n: usize, line: &str, op: &Operation) -> Result<(), ParseError> {
    let refuse = |error: String| ParseError::Operation { line: n, error };
    let given: serde_json::Map<String, serde_json::Value> = serde_json::from_str(line).map_err(|e| refuse(e.to_string()))?;
    let known = match serde_json::to_value(op).map_err(|e| refuse(e.to_string()))? {
        serde_json::Value::Object(m) => m,
        _ => return Err(refuse("an operation is an object".into())),
    };
    let optional = ["member", "epoch", "serializable", "key", "group", "keys_only"];
    if let Some(unknown) = given.keys().find(|k| !known.contains_key(*k) && !optional.contains(&k.as_str())) {
        return Err(refuse(format!("unknown field `{unknown}`")));
    }
    if !given.contains_key("answer") {
        return Err(refuse("missing field `answer` (null when the request got no answer)".into()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_documented_example_parses_and_round_trips() {
        let text = r#"{"format":"shakedown-history","version":1,"model":"etcd"}
{"client":0,"member":"m1","call":1200,"return":1850,"type":"txn","key":"/o/3","if_mod_revision":0,"then":{"put":"c0-1"},"answer":{"succeeded":true,"revision":7}}
{"client":1,"call":1300,"return":1400,"type":"get","key":"/o/3","answer":{"revision":7,"kv":{"value":"c0-1","mod_revision":7}}}
{"client":2,"call":1310,"return":null,"type":"put","key":"/o/4","value":"c2-9","answer":null}
{"client":2,"call":1900,"return":2000,"type":"txn","key":"/o/3","if_mod_revision":7,"then":"delete","answer":{"succeeded":true,"revision":9}}
"#;
        let h = History::parse(text).unwrap();
        assert_eq!(h.ops.len(), 4);
        assert_eq!(h.ops[0].member.as_deref(), Some("m1"));
        assert!(!h.ops[2].request.answered());
        assert_eq!(History::parse(&h.to_jsonl()).unwrap(), h);
    }

    #[test]
    fn bad_files_say_which_line_and_why() {
        assert!(matches!(History::parse(""), Err(ParseError::Empty)));
        assert!(matches!(History::parse("{}"), Err(ParseError::Header(_))));
        let v2 = r#"{"format":"shakedown-history","version":2,"model":"etcd"}"#;
        assert!(matches!(History::parse(v2), Err(ParseError::Version { found: 2 })));
        let wrong = "{\"format\":\"shakedown-history\",\"version\":1,\"model\":\"etcd\"}\n{\"client\":0,\"call\":1,\"return\":2,\"type\":\"read\",\"answer\":{\"value\":1}}";
        let e = History::parse(wrong).unwrap_err();
        assert_eq!(e.to_string(), "line 2: a register operation in a history of model etcd");
        let typo = "{\"format\":\"shakedown-history\",\"version\":1,\"model\":\"register\"}\n\n{\"client\":0,\"call\":1,\"return\":2,\"type\":\"read\",\"anser\":{}}";
        let e = History::parse(typo).unwrap_err();
        assert!(e.to_string().starts_with("line 3: "), "{e}");
        let back = "{\"format\":\"shakedown-history\",\"version\":1,\"model\":\"register\"}\n{\"client\":0,\"call\":5,\"return\":2,\"type\":\"write\",\"value\":1,\"answer\":{}}";
        assert_eq!(History::parse(back).unwrap_err().to_string(), "line 2: return 2 is before call 5");
    }
}
