//! Which file's tables a file id holds, and who may share them: the host's
//! defence against file-id poisoning (`docs/THREAT_MODEL.md`, "File ids").
//!
//! A file id hashes only a file's first and last 4 KiB and its size, so a
//! user can make a file with the id of a root library and other unwind
//! tables in between. The id stays the maps' key; this module decides, per
//! id, which file (device and inode) owns it, the *owner*, whose tables
//! are loaded, and what another file presenting the same id gets:
//!
//! * the same bytes where the owner's analysis read (its
//!   [`SourceDigest`]): it shares the tables;
//! * other bytes: a *collision*. A **trusted** file (root's, writable by
//!   no one else, in directories no one else can write: decided by the
//!   edge, `host::collide`) wins against an untrusted owner, whether it
//!   came first or second: it *replaces* it (the owner's tables are
//!   unloaded, its processes re-judged). Otherwise the owner keeps the id
//!   and the other file is not loaded.
//!
//! An owner that is not loaded yet has nothing to compare with: a trusted
//! candidate takes the id over from an untrusted one (an untrusted file
//! whose extraction failed included, so that its failure never blocks a
//! trusted file), and any other candidate waits until the owner is loaded.
//! An owner loaded from more than its own bytes (a debug file) cannot be
//! compared either: other files collide with it.
//!
//! Pure: the edge opens, reads and stats, and tells this module what it
//! found; verdicts are cached per file stamp, so a file mapped by a
//! thousand processes is read once.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use eim_analysis::elf::digest::SourceDigest;
use eim_machine::FileId;

/// Verdicts a claim keeps before it starts over (a bound on memory: each
/// distinct file stamp presenting one id is one entry).
pub const MAX_VERDICTS: usize = 4096;

/// Which file (not which contents): its device and inode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FileKey {
    pub dev: u64,
    pub inode: u64,
}

/// A file as of one moment: if none of these change, it reads the same,
/// so a verdict about it still holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Stamp {
    pub key: FileKey,
    pub size: u64,
    pub mtime_ns: i128,
    pub ctime_ns: i128,
}

/// A file presenting an id.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Candidate {
    pub stamp: Stamp,
    pub trusted: bool,
    /// As its process sees it, for reports.
    pub path: PathBuf,
}

/// Where the owner's tables are.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum State {
    /// Not loaded yet (this pass will try).
    Pending,
    /// Loaded; the digest of what its analysis read, if it has one.
    Loaded(Option<Arc<SourceDigest>>),
    /// Its extraction or load failed (the id is deferred).
    Failed,
}

/// An id's owner.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Claim {
    pub owner: FileKey,
    pub trusted: bool,
    pub path: PathBuf,
    pub state: State,
    /// Other files judged against this owner: true if the same.
    verdicts: HashMap<Stamp, bool>,
}

/// What to do with a file presenting an id.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Admit {
    /// It is the owner (or now is: the id had none).
    Owner,
    /// Judged before: it shares the owner's tables.
    Same,
    /// Judged before: it collides, and is not loaded.
    Collides,
    /// Compare its bytes with this digest, then [`Claims::judge`].
    Check(Arc<SourceDigest>),
    /// The owner is not loaded yet: ask again once it is.
    Wait,
    /// The owner failed: the id's deferral applies to it too.
    Deferred,
    /// It wins the id from an untrusted owner that has nothing to compare
    /// with: evict the owner's tables and processes, then
    /// [`Claims::take_over`].
    TakeOver,
}

/// What a comparison makes of a candidate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Same bytes: it shares the tables.
    Share,
    /// It loses: not loaded.
    Collision,
    /// It wins: the owner is evicted and the candidate owns the id.
    Replace,
}

/// The rule: equal files share; of two different ones, a trusted file wins
/// against an untrusted owner, and otherwise the owner keeps the id.
pub fn verdict(owner_trusted: bool, candidate_trusted: bool, same: bool) -> Verdict {
    if same {
        Verdict::Share
    } else if candidate_trusted && !owner_trusted {
        Verdict::Replace
    } else {
        Verdict::Collision
    }
}

/// Every id's claim.
#[derive(Clone, Debug, Default)]
pub struct Claims {
    claims: HashMap<FileId, Claim>,
}

impl Claims {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn get(&self, id: FileId) -> Option<&Claim> {
        self.claims.get(&id)
    }

    pub fn len(&self) -> usize {
        self.claims.len()
    }

    pub fn is_empty(&self) -> bool {
        self.claims.is_empty()
    }

    /// What `candidate`, presenting `id`, gets (see [`Admit`]). An id
    /// without a claim becomes the candidate's.
    pub fn admit(&mut self, id: FileId, candidate: &Candidate) -> Admit {
        let Some(claim) = self.claims.get_mut(&id) else {
            self.claims.insert(id, Claim::of(candidate));
            return Admit::Owner;
        };
        if claim.owner == candidate.stamp.key {
            return Admit::Owner;
        }
        if let Some(&same) = claim.verdicts.get(&candidate.stamp) {
            return if same { Admit::Same } else { Admit::Collides };
        }
        let wins = candidate.trusted && !claim.trusted;
        match &claim.state {
            State::Loaded(Some(digest)) => Admit::Check(digest.clone()),
            // Nothing to compare with: as if it differed.
            State::Loaded(None) => match verdict(claim.trusted, candidate.trusted, false) {
                Verdict::Replace => Admit::TakeOver,
                _ => {
                    claim.remember(candidate.stamp, false);
                    Admit::Collides
                }
            },
            State::Pending if wins => Admit::TakeOver,
            State::Pending => Admit::Wait,
            State::Failed if wins => Admit::TakeOver,
            State::Failed => Admit::Deferred,
        }
    }

    /// The comparison of `candidate` with `id`'s owner came out `same`:
    /// the verdict, remembered unless it is a replacement (the candidate
    /// then owns the id: [`Self::take_over`]).
    pub fn judge(&mut self, id: FileId, candidate: &Candidate, same: bool) -> Verdict {
        let Some(claim) = self.claims.get_mut(&id) else {
            return Verdict::Collision;
        };
        let v = verdict(claim.trusted, candidate.trusted, same);
        if v != Verdict::Replace {
            claim.remember(candidate.stamp, same);
        }
        v
    }

    /// `candidate` owns `id` from now on, not loaded yet; the claim it
    /// replaces (its verdicts go with it: they were about other tables).
    pub fn take_over(&mut self, id: FileId, candidate: &Candidate) -> Option<Claim> {
        self.claims.insert(id, Claim::of(candidate))
    }

    /// `id` was loaded from the owner's file (or one judged the same),
    /// whose analysis read what `digest` says.
    pub fn loaded(&mut self, id: FileId, digest: Option<Arc<SourceDigest>>) {
        if let Some(claim) = self.claims.get_mut(&id) {
            if !matches!(claim.state, State::Loaded(_)) {
                claim.state = State::Loaded(digest);
            }
        }
    }

    /// `id`'s owner could not be loaded.
    pub fn failed(&mut self, id: FileId) {
        if let Some(claim) = self.claims.get_mut(&id) {
            if claim.state == State::Pending {
                claim.state = State::Failed;
            }
        }
    }

    /// Forgets `id`'s claim: its tables are gone (unloaded, or never
    /// loaded and no longer deferred), so the next file to present it
    /// owns it.
    pub fn forget(&mut self, id: FileId) -> Option<Claim> {
        self.claims.remove(&id)
    }

    /// Every id with a claim.
    pub fn ids(&self) -> impl Iterator<Item = FileId> + '_ {
        self.claims.keys().copied()
    }

    /// The ids whose owner is still pending (a pass ends: what it did not
    /// load has no tables to defend).
    pub fn pending(&self) -> Vec<FileId> {
        self.claims
            .iter()
            .filter(|(_, c)| c.state == State::Pending)
            .map(|(id, _)| *id)
            .collect()
    }
}

impl Claim {
    fn of(candidate: &Candidate) -> Self {
        Self {
            owner: candidate.stamp.key,
            trusted: candidate.trusted,
            path: candidate.path.clone(),
            state: State::Pending,
            verdicts: HashMap::new(),
        }
    }

    fn remember(&mut self, stamp: Stamp, same: bool) {
        if self.verdicts.len() >= MAX_VERDICTS {
            self.verdicts.clear();
        }
        self.verdicts.insert(stamp, same);
    }

    /// Files judged against this owner.
    pub fn judged(&self) -> usize {
        self.verdicts.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use eim_analysis::elf::source::LazyFile;

    const ID: FileId = FileId(7);

    fn cand(inode: u64, trusted: bool) -> Candidate {
        Candidate {
            stamp: Stamp {
                key: FileKey { dev: 1, inode },
                size: 100,
                mtime_ns: 5,
                ctime_ns: 6,
            },
            trusted,
            path: PathBuf::from(format!("/f{inode}")),
        }
    }

    fn digest() -> Arc<SourceDigest> {
        let lazy = LazyFile::new(Box::new(vec![1u8; 100]), 100);
        lazy.view().bytes_at(0, 10).expect("read");
        Arc::new(SourceDigest::of(&lazy).expect("digest"))
    }

    #[test]
    fn the_rule() {
        for owner in [false, true] {
            for candidate in [false, true] {
                assert_eq!(verdict(owner, candidate, true), Verdict::Share);
            }
        }
        assert_eq!(verdict(false, true, false), Verdict::Replace);
        assert_eq!(verdict(true, false, false), Verdict::Collision);
        assert_eq!(
            verdict(true, true, false),
            Verdict::Collision,
            "first trusted keeps it"
        );
        assert_eq!(
            verdict(false, false, false),
            Verdict::Collision,
            "first untrusted keeps it"
        );
    }

    #[test]
    fn the_first_file_owns_and_a_copy_is_checked_once() {
        let mut c = Claims::new();
        let root = cand(1, true);
        assert_eq!(c.admit(ID, &root), Admit::Owner);
        assert_eq!(c.admit(ID, &root), Admit::Owner);
        let copy = cand(2, false);
        assert_eq!(c.admit(ID, &copy), Admit::Wait, "nothing to compare yet");
        let d = digest();
        c.loaded(ID, Some(d.clone()));
        assert_eq!(c.admit(ID, &copy), Admit::Check(d));
        assert_eq!(c.judge(ID, &copy, true), Verdict::Share);
        assert_eq!(c.admit(ID, &copy), Admit::Same, "cached");
        // Changed since (another mtime): judged again.
        let mut touched = copy.clone();
        touched.stamp.mtime_ns += 1;
        assert!(matches!(c.admit(ID, &touched), Admit::Check(_)));
        assert_eq!(c.judge(ID, &touched, false), Verdict::Collision);
        assert_eq!(c.admit(ID, &touched), Admit::Collides);
        assert_eq!(c.get(ID).map(Claim::judged), Some(2));
    }

    #[test]
    fn a_trusted_file_wins_against_an_untrusted_owner_in_every_state() {
        let attacker = cand(1, false);
        let root = cand(2, true);
        // Loaded with a digest: compared, then replaced.
        let mut c = Claims::new();
        c.admit(ID, &attacker);
        c.loaded(ID, Some(digest()));
        assert!(matches!(c.admit(ID, &root), Admit::Check(_)));
        assert_eq!(c.judge(ID, &root, false), Verdict::Replace);
        let old = c.take_over(ID, &root).expect("old claim");
        assert_eq!(old.owner, attacker.stamp.key);
        assert_eq!(c.get(ID).map(|c| c.owner), Some(root.stamp.key));
        assert_eq!(c.get(ID).map(|c| c.state.clone()), Some(State::Pending));
        // Now the attacker waits for root's tables, then collides.
        assert_eq!(c.admit(ID, &attacker), Admit::Wait);
        c.loaded(ID, Some(digest()));
        assert!(matches!(c.admit(ID, &attacker), Admit::Check(_)));
        assert_eq!(c.judge(ID, &attacker, false), Verdict::Collision);
        assert_eq!(c.admit(ID, &attacker), Admit::Collides);

        // Pending, failed, or loaded without a digest: taken over.
        for state in [State::Pending, State::Failed, State::Loaded(None)] {
            let mut c = Claims::new();
            c.admit(ID, &attacker);
            match &state {
                State::Pending => {}
                State::Failed => c.failed(ID),
                State::Loaded(d) => c.loaded(ID, d.clone()),
            }
            assert_eq!(c.admit(ID, &root), Admit::TakeOver, "{state:?}");
        }
    }

    #[test]
    fn an_untrusted_file_never_wins_against_a_trusted_owner() {
        let root = cand(1, true);
        let attacker = cand(2, false);
        let mut c = Claims::new();
        c.admit(ID, &root);
        assert_eq!(c.admit(ID, &attacker), Admit::Wait);
        c.failed(ID);
        assert_eq!(
            c.admit(ID, &attacker),
            Admit::Deferred,
            "root's failure is root's"
        );
        let mut c = Claims::new();
        c.admit(ID, &root);
        c.loaded(ID, None);
        assert_eq!(
            c.admit(ID, &attacker),
            Admit::Collides,
            "no digest: cannot share"
        );
        let mut c = Claims::new();
        c.admit(ID, &root);
        c.loaded(ID, Some(digest()));
        assert!(matches!(c.admit(ID, &attacker), Admit::Check(_)));
        assert_eq!(c.judge(ID, &attacker, false), Verdict::Collision);
        assert_eq!(c.get(ID).map(|c| c.owner), Some(root.stamp.key));
    }

    #[test]
    fn verdicts_are_bounded_and_forgetting_frees_the_id() {
        let mut c = Claims::new();
        c.admit(ID, &cand(0, true));
        c.loaded(ID, Some(digest()));
        for inode in 1..=(MAX_VERDICTS as u64 + 10) {
            let other = cand(inode, false);
            c.admit(ID, &other);
            c.judge(ID, &other, true);
        }
        assert!(c.get(ID).map_or(0, Claim::judged) <= MAX_VERDICTS);
        assert!(c.forget(ID).is_some());
        assert_eq!(c.admit(ID, &cand(99, false)), Admit::Owner);
        assert_eq!(c.pending(), vec![ID]);
    }
}
