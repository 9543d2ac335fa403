//! `limit` and `continue` for lists the cache answers (sans-IO): the first page keeps the
//! whole filtered, rendered list as a snapshot, and every continue token points into it,
//! so the pages of one list are consistent with each other as on the API server. Snapshots
//! expire like the API server's tokens do (its etcd compaction); an expired or unknown
//! token is answered `410 Expired`.

use std::{
    collections::BTreeMap,
    sync::Arc,
    time::{Duration, Instant},
};

use bytes::Bytes;

/// How long a list's continue tokens stay valid (the API server's are valid until etcd
/// compacts their revision, every 5 minutes by default).
pub const SNAPSHOT_TTL: Duration = Duration::from_secs(300);
/// The bytes all kept snapshots may hold; beyond it the oldest are dropped first.
pub const MAX_SNAPSHOT_BYTES: usize = 512 * 1024 * 1024;
/// The prefix that marks a continue token as the hub's (other tokens are the API
/// server's, from a list the tunnel answered).
pub const TOKEN_PREFIX: &str = "scale-agent-hub.";

/// One list's items, rendered, with what the pages repeat.
#[derive(Debug)]
pub struct Snapshot {
    /// What the list was of (account, path, selectors, form): a token is only good for the
    /// same list.
    pub list: String,
    pub resource_version: String,
    /// The list's (kind, apiVersion).
    pub list_type: (String, String),
    pub items: Vec<Bytes>,
    /// Whether `remainingItemCount` is reported (the API server reports it only for lists
    /// without selectors).
    pub count_remaining: bool,
}

impl Snapshot {
    fn bytes(&self) -> usize {
        self.items.iter().map(Bytes::len).sum()
    }
}

/// A page of a snapshot.
#[derive(Debug, PartialEq, Eq)]
pub struct Page {
    pub items: Vec<Bytes>,
    /// The token for the next page, when there is one.
    pub continue_token: Option<String>,
    pub remaining: Option<usize>,
}

/// Why a continue token cannot be used.
#[derive(Debug, PartialEq, Eq)]
pub enum TokenError {
    /// Unknown or expired: 410, start the list again.
    Expired,
    /// A token of another list: 400.
    OtherList,
}

/// The snapshots behind the continue tokens handed out.
#[derive(Debug, Default)]
pub struct Snapshots {
    next_id: u64,
    /// By id: (created, snapshot).
    kept: BTreeMap<u64, (Instant, Arc<Snapshot>)>,
    bytes: usize,
}

fn token(id: u64, offset: usize) -> String {
    format!("{TOKEN_PREFIX}{id}.{offset}")
}

fn parse_token(token: &str) -> Option<(u64, usize)> {
    let (id, offset) = token.strip_prefix(TOKEN_PREFIX)?.split_once('.')?;
    Some((id.parse().ok()?, offset.parse().ok()?))
}

/// Whether a continue token is the hub's.
pub fn is_hub_token(token: &str) -> bool {
    token.starts_with(TOKEN_PREFIX)
}

impl Snapshots {
    fn expire(&mut self, now: Instant) {
        while let Some((&id, (created, snapshot))) = self.kept.iter().next() {
            let too_old = now.saturating_duration_since(*created) >= SNAPSHOT_TTL;
            if !too_old && self.bytes <= MAX_SNAPSHOT_BYTES {
                break;
            }
            self.bytes -= snapshot.bytes();
            self.kept.remove(&id);
        }
    }

    /// The first page of a list: all of it when it fits in `limit`, else `limit` items and
    /// a token (the snapshot is kept).
    pub fn first_page(&mut self, snapshot: Snapshot, limit: Option<usize>, now: Instant) -> Page {
        self.expire(now);
        let limit = limit.unwrap_or(usize::MAX);
        if snapshot.items.len() <= limit {
            return Page {
                items: snapshot.items,
                continue_token: None,
                remaining: None,
            };
        }
        let id = self.next_id;
        self.next_id += 1;
        let snapshot = Arc::new(snapshot);
        self.bytes += snapshot.bytes();
        self.kept.insert(id, (now, snapshot.clone()));
        let page = page_of(&snapshot, id, 0, limit);
        self.expire(now);
        page
    }

    /// The page after `token` of the list `list`, with its snapshot's resourceVersion.
    pub fn next_page(
        &mut self,
        token: &str,
        list: &str,
        limit: Option<usize>,
        now: Instant,
    ) -> Result<(Page, Arc<Snapshot>), TokenError> {
        self.expire(now);
        let (id, offset) = parse_token(token).ok_or(TokenError::Expired)?;
        let (_, snapshot) = self.kept.get(&id).ok_or(TokenError::Expired)?;
        if snapshot.list != list {
            return Err(TokenError::OtherList);
        }
        let snapshot = snapshot.clone();
        let page = page_of(&snapshot, id, offset, limit.unwrap_or(usize::MAX));
        if page.continue_token.is_none() {
            // The last page was handed out: the snapshot is no longer needed.
            if let Some((_, s)) = self.kept.remove(&id) {
                self.bytes -= s.bytes();
            }
        }
        Ok((page, snapshot))
    }
}

fn page_of(snapshot: &Snapshot, id: u64, offset: usize, limit: usize) -> Page {
    let start = offset.min(snapshot.items.len());
    let end = start.saturating_add(limit).min(snapshot.items.len());
    let rest = snapshot.items.len() - end;
    Page {
        items: snapshot.items[start..end].to_vec(),
        continue_token: (rest > 0).then(|| token(id, end)),
        remaining: (rest > 0 && snapshot.count_remaining).then_some(rest),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snapshot(n: usize) -> Snapshot {
        Snapshot {
            list: "a|/api/v1/configmaps".into(),
            resource_version: "42".into(),
            list_type: ("ConfigMapList".into(), "v1".into()),
            items: (0..n).map(|i| Bytes::from(i.to_string())).collect(),
            count_remaining: true,
        }
    }

    #[test]
    fn pages_cover_every_item_once() {
        let now = Instant::now();
        let mut s = Snapshots::default();
        let mut page = s.first_page(snapshot(1234), Some(500), now);
        let mut seen = page.items.clone();
        assert_eq!(page.remaining, Some(734));
        while let Some(token) = page.continue_token.clone() {
            assert!(is_hub_token(&token));
            let (next, snapshot) = s
                .next_page(&token, "a|/api/v1/configmaps", Some(500), now)
                .unwrap();
            assert_eq!(snapshot.resource_version, "42");
            page = next;
            seen.extend(page.items.clone());
        }
        assert_eq!(seen, snapshot(1234).items);
        assert!(s.kept.is_empty(), "the last page releases the snapshot");
    }

    #[test]
    fn small_lists_need_no_token() {
        let mut s = Snapshots::default();
        let page = s.first_page(snapshot(3), Some(500), Instant::now());
        assert_eq!(page.items.len(), 3);
        assert_eq!(page.continue_token, None);
        assert!(s.kept.is_empty());
    }

    #[test]
    fn tokens_expire_and_belong_to_their_list() {
        let now = Instant::now();
        let mut s = Snapshots::default();
        let token = s
            .first_page(snapshot(10), Some(4), now)
            .continue_token
            .unwrap();
        assert_eq!(
            s.next_page(&token, "other", Some(4), now).unwrap_err(),
            TokenError::OtherList
        );
        assert_eq!(
            s.next_page(&token, "a|/api/v1/configmaps", Some(4), now + SNAPSHOT_TTL)
                .unwrap_err(),
            TokenError::Expired
        );
        assert_eq!(
            s.next_page("scale-agent-hub.x", "l", None, now)
                .unwrap_err(),
            TokenError::Expired
        );
        assert_eq!(s.bytes, 0);
    }
}
