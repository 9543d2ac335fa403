//! `limit` and `continue` for lists the cache answers (sans-IO). The first page pins the
//! list's objects: pointers to the cached objects of its scope at its resourceVersion, in
//! the list's order, not copies and not rendered; each page renders only its own items,
//! and every continue token points into the pinned list, so the pages of one list are
//! exactly the objects of its resourceVersion, whatever was written meanwhile, as on the
//! API server. A pinned list costs a pointer per object (the objects themselves are the
//! cache's, shared; an object replaced meanwhile stays alive until the list's pages are
//! done). No budget is shared by the lists: one list never expires another.
//!
//! A token expires (`410 Expired`, start the list again) only
//! - on a real resourceVersion gap: the kind's events since the list stopped being one
//!   unbroken sequence (the agent relisted it, its scope was dropped, the account left); the
//!   caller checks that when a token comes back ([`Snapshots::end`] drops a list it finds
//!   broken), as the API server answers 410 once etcd compacted the list's revision;
//! - or when its list was abandoned: no page asked for [`ABANDONED_AFTER`] (a client that
//!   stops half-way through a list never says so; the API server's tokens do not outlive
//!   its compaction window, 5 minutes, either).

use std::{
    collections::BTreeMap,
    sync::Arc,
    time::{Duration, Instant},
};

use bytes::Bytes;

/// How long a list's tokens stay valid after its last page was asked for.
pub const ABANDONED_AFTER: Duration = Duration::from_secs(300);
/// How often at most the kept lists are swept for abandoned ones.
const SWEEP_EVERY: Duration = Duration::from_secs(1);
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
    /// By id: (last page asked for, snapshot).
    kept: BTreeMap<u64, (Instant, Arc<Snapshot<T, C>>)>,
    /// Pointers the kept lists hold.
    pinned: usize,
    swept: Option<Instant>,
}

impl<T, C> Default for Snapshots<T, C> {
    fn default() -> Self {
        Snapshots {
            next_id: 0,
            kept: BTreeMap::new(),
            pinned: 0,
            swept: None,
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
    /// Drops the abandoned lists (at most once per [`SWEEP_EVERY`]).
    fn expire(&mut self, now: Instant) {
        if self
            .swept
            .is_some_and(|at| now.saturating_duration_since(at) < SWEEP_EVERY)
        {
            return;
        }
        self.swept = Some(now);
        let pinned = &mut self.pinned;
        self.kept.retain(|_, (used, snapshot)| {
            let abandoned = now.saturating_duration_since(*used) >= ABANDONED_AFTER;
            if abandoned {
                *pinned -= snapshot.objects.len();
            }
            !abandoned
        });
    }

    /// Pointers the kept lists hold (what their tokens cost).
    pub fn pinned(&self) -> usize {
        self.pinned
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
        let (used, snapshot) = self.kept.get_mut(&id).ok_or(TokenError::Expired)?;
        if snapshot.list != list {
            return Err(TokenError::OtherList);
        }
        *used = now;
        Ok(Cursor {
            id: Some(id),
            offset,
            snapshot: snapshot.clone(),
        })
    }

    /// Drops the list of `cursor` (a gap found since it was taken): its tokens expire.
    pub fn end(&mut self, cursor: Cursor<T, C>) {
        if let Some(id) = cursor.id {
            self.release(id);
        }
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

    /// No budget is shared by the lists: lists pinning far more pointers than the cap they
    /// once shared (64 Mi, past which the oldest lists were dropped) all keep their tokens.
    #[test]
    fn no_pinned_budget_expires_a_list() {
        let now = Instant::now();
        let s = Mutex::new(Snapshots::default());
        let big = |_| Snapshot {
            context: (),
            list: LIST.into(),
            resource_version: "7".into(),
            list_type: ("ConfigMapList".into(), "v1".into()),
            objects: vec![0u8; 1 << 20],
            count_remaining: true,
        };
        let one = |_: &u8| -> Result<Option<Bytes>, Infallible> { Ok(Some(Bytes::new())) };
        let tokens: Vec<String> = (0..80)
            .map(|i| {
                page(&s, Snapshots::start(big(i)), Some(500), now, one)
                    .unwrap()
                    .continue_token
                    .unwrap()
            })
            .collect();
        assert_eq!(s.lock().unwrap().pinned(), 80 << 20);
        for token in &tokens {
            assert!(s.lock().unwrap().resume(token, LIST, now).is_ok());
        }
    }

    /// A list whose pages keep being asked for outlives [`ABANDONED_AFTER`]; one ended (a
    /// gap found by the caller) expires at once.
    #[test]
    fn lists_in_use_stay_and_ended_lists_expire() {
        let now = Instant::now();
        let s = Mutex::new(Snapshots::default());
        let mut cursor = Snapshots::start(snapshot(100));
        let mut at = now;
        for _ in 0..5 {
            let token = page(&s, cursor, Some(10), at, render)
                .unwrap()
                .continue_token
                .unwrap();
            at += ABANDONED_AFTER / 2;
            cursor = s.lock().unwrap().resume(&token, LIST, at).unwrap();
        }
        assert!(at.duration_since(now) > ABANDONED_AFTER * 2);
        let token = page(&s, cursor, Some(10), at, render)
            .unwrap()
            .continue_token
            .unwrap();
        let cursor = s.lock().unwrap().resume(&token, LIST, at).unwrap();
        s.lock().unwrap().end(cursor);
        assert_eq!(
            s.lock().unwrap().resume(&token, LIST, at).unwrap_err(),
            TokenError::Expired
        );
        assert_eq!(s.lock().unwrap().pinned(), 0);
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
            kept.resume(&token, LIST, now + ABANDONED_AFTER)
                .unwrap_err(),
            TokenError::Expired,
            "abandoned"
        );
        assert_eq!(
            kept.resume("scale-agent-hub.x", "l", now).unwrap_err(),
            TokenError::Expired
        );
        assert_eq!(kept.pinned, 0);
    }
}
