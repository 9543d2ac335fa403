//! What a watch yields, whichever decoder read it: kube's for full objects, or the
//! Secrets' own (`secrets`), which must not depend on the watch loop that uses it.

use kube::core::Status;
use serde_json::Value;

/// An event of either a full-object or a Secrets' metadata watch.
pub enum Event {
    Applied(Value),
    Deleted(Value),
    Bookmark(String),
    Error(Box<Status>),
}
