//! `limit` and `continue` for lists the cache answers (sans-IO). The first page pins the
//! list's objects: pointers to the cached objects of its scope at its resourceVersion, in
//! the list's order, not copies and not rendered; each page renders only its own items,
//! and every continue token points into the pinned list, so the pages of one list are
//! consistent with each other as on the API server. A pinned list costs a pointer per
//! object (the objects themselves are the cache's, shared; an object replaced meanwhile
//! stays alive until the list's pages are done or expire). So concurrent big lists do not
//! push each other out: a token expires when its list is older than the API server's
//! compaction window, or (only past [`MAX_PINNED`] pointers, 64 million objects) when the
//! oldest lists are dropped; an expired or unknown token is answered `410 Expired`.

use std::{
    collections::BTreeMap,
    sync::Arc,
    time::{Duration, Instant},
};

use bytes::Bytes;

/// How long a list's continue tokens stay valid (the API server's are valid until etcd
/// compacts their revision, every 5 minutes by default).
pub const SNAPSHOT_TTL: Duration = Duration::from_secs(300);
/// The objects all kept lists may pin together (a pointer each); beyond it the oldest
/// lists are dropped first.
pub const MAX_PINNED: usize = 64 * 1024 * 1024;
/// The prefix that marks a continue token as the hub's (other tokens are the API
/// server's, from a list the tunnel answered).
pub const TOKEN_PREFIX: &str = "scale-agent-hub.";

/// One list's objects, pinned, with what the pages repeat.
#[derive(Debug)]
pub struct Snapshot<T, C> {
    /// What rendering an item needs besides the object (the kind, the field selector).
    pub context: C,
    /// What the list was of (account, path, selectors, form): a token is only good for the
    /// same list.
    pub list: String,
    pub resource_version: String,
    /// The list's (kind, apiVersion).
    pub list_type: (String, String),
    /// In the list's order, before the selectors (applied as each page is rendered).
    pub objects: Vec<T>,
    /// Whether `remainingItemCount` is reported (the API server reports it only for lists
    /// without selectors, where every object is an item).
    pub count_remaining: bool,
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

/// The lists behind the continue tokens handed out.
#[derive(Debug)]
pub struct Snapshots<T, C> {
    next_id: u64,
    /// By id: (created, snapshot).
    kept: BTreeMap<u64, (Instant, Arc<Snapshot<T, C>>)>,
    pinned: usize,
}

impl<T, C> Default for Snapshots<T, C> {
    fn default() -> Self {
        Snapshots {
            next_id: 0,
            kept: BTreeMap::new(),
            pinned: 0,
        }
    }
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

/// Where a list's next page starts: a kept snapshot and an offset in it.
#[derive(Debug)]
pub struct Cursor<T, C> {
    id: Option<u64>,
    offset: usize,
    pub snapshot: Arc<Snapshot<T, C>>,
}

impl<T, C> Snapshots<T, C> {
    fn expire(&mut self, now: Instant) {
        while let Some((&id, (created, snapshot))) = self.kept.iter().next() {
            let too_old = now.saturating_duration_since(*created) >= SNAPSHOT_TTL;
            if !too_old && self.pinned <= MAX_PINNED {
                break;
            }
            self.pinned -= snapshot.objects.len();
            self.kept.remove(&id);
        }
    }

    /// The start of a new list. Kept only once its first page leaves items for a token
    /// ([`Snapshots::keep`]).
    pub fn start(snapshot: Snapshot<T, C>) -> Cursor<T, C> {
        Cursor {
            id: None,
            offset: 0,
            snapshot: Arc::new(snapshot),
        }
    }

    fn keep(&mut self, snapshot: &Arc<Snapshot<T, C>>, now: Instant) -> u64 {
        self.expire(now);
        let id = self.next_id;
        self.next_id += 1;
        self.pinned += snapshot.objects.len();
        self.kept.insert(id, (now, snapshot.clone()));
        self.expire(now);
        id
    }

    /// Where the page after `token` of the list `list` starts.
    pub fn resume(
        &mut self,
        token: &str,
        list: &str,
        now: Instant,
    ) -> Result<Cursor<T, C>, TokenError> {
        self.expire(now);
        let (id, offset) = parse_token(token).ok_or(TokenError::Expired)?;
        let (_, snapshot) = self.kept.get(&id).ok_or(TokenError::Expired)?;
        if snapshot.list != list {
            return Err(TokenError::OtherList);
        }
        Ok(Cursor {
            id: Some(id),
            offset,
            snapshot: snapshot.clone(),
        })
    }

    fn release(&mut self, id: u64) {
        if let Some((_, s)) = self.kept.remove(&id) {
            self.pinned -= s.objects.len();
        }
    }
}

/// Renders the page at `cursor`: up to `limit` items (the selectors may leave objects
/// out), rendered by `render` outside any lock (`snapshots` is locked only to keep or
/// release the list). The first page of a list that needs a token keeps the list; the last
/// page releases it.
pub fn page<T, C, E>(
    snapshots: &std::sync::Mutex<Snapshots<T, C>>,
    cursor: Cursor<T, C>,
    limit: Option<usize>,
    now: Instant,
    mut render: impl FnMut(&T) -> Result<Option<Bytes>, E>,
) -> Result<Page, E> {
    let lock = || snapshots.lock().unwrap_or_else(|e| e.into_inner());
    let objects = &cursor.snapshot.objects;
    let limit = limit.unwrap_or(usize::MAX).max(1);
    let mut at = cursor.offset.min(objects.len());
    let mut items = Vec::new();
    while at < objects.len() && items.len() < limit {
        if let Some(item) = render(&objects[at])? {
            items.push(item);
        }
        at += 1;
    }
    let rest = objects.len() - at;
    let continue_token = if rest == 0 {
        if let Some(id) = cursor.id {
            lock().release(id);
        }
        None
    } else {
        let id = match cursor.id {
            Some(id) => id,
            None => lock().keep(&cursor.snapshot, now),
        };
        Some(token(id, at))
    };
    Ok(Page {
        items,
        continue_token,
        remaining: (rest > 0 && cursor.snapshot.count_remaining).then_some(rest),
    })
}

#[cfg(test)]
mod tests {
    use std::{convert::Infallible, sync::Mutex};

    use super::*;

    const LIST: &str = "a|/api/v1/configmaps";

    fn snapshot(n: usize) -> Snapshot<usize, ()> {
        Snapshot {
            context: (),
            list: LIST.into(),
            resource_version: "42".into(),
            list_type: ("ConfigMapList".into(), "v1".into()),
            objects: (0..n).collect(),
            count_remaining: true,
        }
    }

    fn render(i: &usize) -> Result<Option<Bytes>, Infallible> {
        Ok(Some(Bytes::from(i.to_string())))
    }

    fn all(n: usize) -> Vec<Bytes> {
        (0..n).map(|i| Bytes::from(i.to_string())).collect()
    }

    #[test]
    fn pages_cover_every_item_once() {
        let now = Instant::now();
        let s = Mutex::new(Snapshots::default());
        let first = Snapshots::start(snapshot(1234));
        let mut page = page(&s, first, Some(500), now, render).unwrap();
        let mut seen = page.items.clone();
        assert_eq!(page.remaining, Some(734));
        while let Some(token) = page.continue_token.clone() {
            assert!(is_hub_token(&token));
            let cursor = s.lock().unwrap().resume(&token, LIST, now).unwrap();
            assert_eq!(cursor.snapshot.resource_version, "42");
            page = super::page(&s, cursor, Some(500), now, render).unwrap();
            seen.extend(page.items.clone());
        }
        assert_eq!(seen, all(1234));
        let s = s.into_inner().unwrap();
        assert!(s.kept.is_empty(), "the last page releases the snapshot");
        assert_eq!(s.pinned, 0);
    }

    #[test]
    fn small_lists_need_no_token() {
        let s = Mutex::new(Snapshots::default());
        let page = page(
            &s,
            Snapshots::start(snapshot(3)),
            Some(500),
            Instant::now(),
            render,
        )
        .unwrap();
        assert_eq!(page.items.len(), 3);
        assert_eq!(page.continue_token, None);
        assert!(s.lock().unwrap().kept.is_empty());
    }

    /// Pages leave out what the selectors leave out, and still cover the rest once.
    #[test]
    fn selected_pages() {
        let now = Instant::now();
        let s = Mutex::new(Snapshots::default());
        let even = |i: &usize| -> Result<Option<Bytes>, Infallible> {
            Ok(i.is_multiple_of(2).then(|| Bytes::from(i.to_string())))
        };
        let mut cursor = Snapshots::start(snapshot(25));
        let mut seen = Vec::new();
        loop {
            let p = page(&s, cursor, Some(4), now, even).unwrap();
            assert!(p.items.len() <= 4);
            seen.extend(p.items);
            let Some(token) = p.continue_token else { break };
            cursor = s.lock().unwrap().resume(&token, LIST, now).unwrap();
        }
        let expected: Vec<Bytes> = (0..25)
            .filter(|i: &usize| i.is_multiple_of(2))
            .map(|i| Bytes::from(i.to_string()))
            .collect();
        assert_eq!(seen, expected);
    }

    /// Many big lists at once keep their pages: a list pins pointers, not rendered
    /// objects, so none pushes another out.
    #[test]
    fn concurrent_lists_do_not_expire_each_other() {
        let now = Instant::now();
        let s = Mutex::new(Snapshots::default());
        let tokens: Vec<String> = (0..200)
            .map(|_| {
                page(
                    &s,
                    Snapshots::start(snapshot(10_000)),
                    Some(500),
                    now,
                    render,
                )
                .unwrap()
                .continue_token
                .unwrap()
            })
            .collect();
        for token in &tokens {
            let cursor = s.lock().unwrap().resume(token, LIST, now).unwrap();
            assert_eq!(cursor.offset, 500);
        }
        assert_eq!(s.lock().unwrap().pinned, 200 * 10_000);
    }

    #[test]
    fn tokens_expire_and_belong_to_their_list() {
        let now = Instant::now();
        let s = Mutex::new(Snapshots::default());
        let token = page(&s, Snapshots::start(snapshot(10)), Some(4), now, render)
            .unwrap()
            .continue_token
            .unwrap();
        let mut kept = s.lock().unwrap();
        assert_eq!(
            kept.resume(&token, "other", now).unwrap_err(),
            TokenError::OtherList
        );
        assert_eq!(
            kept.resume(&token, LIST, now + SNAPSHOT_TTL).unwrap_err(),
            TokenError::Expired
        );
        assert_eq!(
            kept.resume("scale-agent-hub.x", "l", now).unwrap_err(),
            TokenError::Expired
        );
        assert_eq!(kept.pinned, 0);
    }
}
