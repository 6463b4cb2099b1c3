//! The bound on connections served at once.
//!
//! A full server must not let idle connections lock scrapers out: a local
//! user can open thousands and send nothing. So a new connection at the bound
//! takes the slot of the oldest connection that has not yet sent a complete
//! request head (that one is closed); only when every slot serves a real
//! request is the new connection closed at once. Slots are semaphore permits
//! held by the connection tasks, so a slot is free exactly when the task that
//! held it is gone (its socket closed with it).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::AbortHandle;

/// The slots of one server.
#[derive(Debug)]
pub(super) struct Slots {
    permits: Arc<Semaphore>,
    /// Connections still waiting for their first request head, oldest first
    /// (at most one per permit).
    idle: Mutex<VecDeque<(u64, AbortHandle)>>,
    next_id: AtomicU64,
}

/// A connection's hold on its slot; released when dropped, which happens
/// when its task ends or is aborted.
#[derive(Debug)]
pub(super) struct Slot {
    id: u64,
    slots: Arc<Slots>,
    has_sent_a_head: AtomicBool,
    _permit: OwnedSemaphorePermit,
}

impl Slots {
    pub(super) fn new(limit: usize) -> Arc<Self> {
        Arc::new(Self {
            permits: Arc::new(Semaphore::new(limit)),
            idle: Mutex::new(VecDeque::with_capacity(limit)),
            next_id: AtomicU64::new(0),
        })
    }

    fn idle(&self) -> MutexGuard<'_, VecDeque<(u64, AbortHandle)>> {
        // The queue stays consistent at every step: a panic elsewhere while
        // it was held does not make it wrong.
        self.idle.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A slot for a new connection: a free one, else the one of the oldest
    /// connection still waiting for its first head (aborted to make room);
    /// `None` when every slot serves a request.
    pub(super) async fn admit(self: &Arc<Self>) -> Option<Slot> {
        let permit = match self.permits.clone().try_acquire_owned() {
            Ok(permit) => permit,
            Err(_) => {
                let (_, oldest) = self.idle().pop_front()?;
                oldest.abort();
                // The aborted task gives its permit back when the runtime
                // drops it, which this await lets happen.
                self.permits.clone().acquire_owned().await.ok()?
            }
        };
        Some(Slot {
            id: self.next_id.fetch_add(1, Ordering::Relaxed),
            slots: self.clone(),
            has_sent_a_head: AtomicBool::new(false),
            _permit: permit,
        })
    }

    /// How many connections are waiting for their first head.
    #[cfg(test)]
    pub(super) fn idle_count(&self) -> usize {
        self.idle().len()
    }
}

impl Slot {
    /// Registers the task serving this connection as one that may be closed
    /// to make room, until [`Self::head_received`]. Called right after the
    /// task is spawned: on the current-thread runtime it has not run yet.
    pub(super) fn waiting_for_head(&self, task: AbortHandle) {
        if !self.has_sent_a_head.load(Ordering::Relaxed) {
            self.slots.idle().push_back((self.id, task));
        }
    }

    /// The client sent a complete request head: a real client, not to be
    /// closed for a newcomer.
    pub(super) fn head_received(&self) {
        if !self.has_sent_a_head.swap(true, Ordering::Relaxed) {
            self.forget();
        }
    }

    fn forget(&self) {
        let mut idle = self.slots.idle();
        if let Some(i) = idle.iter().position(|(id, _)| *id == self.id) {
            idle.remove(i);
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.forget();
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::sync::oneshot;
    use tokio::task::JoinHandle;

    use super::*;

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("runtime")
    }

    /// A connection task as the server spawns one: it holds a new slot
    /// until aborted, registered as waiting for its head.
    async fn connection(slots: &Arc<Slots>) -> Option<(JoinHandle<()>, oneshot::Sender<()>)> {
        let slot = slots.admit().await?;
        let (head_tx, head_rx) = oneshot::channel::<()>();
        let (slot_tx, slot_rx) = oneshot::channel::<Slot>();
        let task = tokio::spawn(async move {
            let Ok(slot) = slot_rx.await else { return };
            if head_rx.await.is_ok() {
                slot.head_received();
            }
            std::future::pending::<()>().await;
        });
        slot.waiting_for_head(task.abort_handle());
        slot_tx.send(slot).expect("the task is alive");
        Some((task, head_tx))
    }

    #[test]
    fn a_newcomer_at_the_bound_takes_the_oldest_idle_slot() {
        runtime().block_on(async {
            let slots = Slots::new(2);
            let (oldest, _) = connection(&slots).await.expect("free slot");
            let (younger, _) = connection(&slots).await.expect("free slot");
            assert_eq!(slots.idle_count(), 2);
            let (newcomer, _) = tokio::time::timeout(Duration::from_secs(5), connection(&slots))
                .await
                .expect("admission does not wait for the oldest to end by itself")
                .expect("the oldest idle slot is taken");
            assert!(oldest.await.expect_err("aborted").is_cancelled());
            assert!(!younger.is_finished(), "the younger one is kept");
            assert_eq!(slots.idle_count(), 2);
            younger.abort();
            newcomer.abort();
        });
    }

    #[test]
    fn connections_that_sent_a_head_are_never_pushed_out() {
        runtime().block_on(async {
            let slots = Slots::new(1);
            let (task, head) = connection(&slots).await.expect("free slot");
            assert_eq!(slots.idle_count(), 1);
            head.send(()).expect("the task is alive");
            for _ in 0..100 {
                if slots.idle_count() == 0 {
                    break;
                }
                tokio::task::yield_now().await;
            }
            assert_eq!(slots.idle_count(), 0);
            assert!(slots.admit().await.is_none(), "full of real requests");
            assert!(!task.is_finished());
            task.abort();
            let _ = task.await;
            assert!(slots.admit().await.is_some(), "the slot came back");
        });
    }

    #[test]
    fn a_slot_leaves_the_idle_queue_when_its_task_ends() {
        runtime().block_on(async {
            let slots = Slots::new(3);
            let (task, _) = connection(&slots).await.expect("free slot");
            assert_eq!(slots.idle_count(), 1);
            task.abort();
            let _ = task.await;
            assert_eq!(slots.idle_count(), 0);
            assert_eq!(slots.permits.available_permits(), 3);
        });
    }
}
