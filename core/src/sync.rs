//! The one place that chooses between `std` and loom's model of it, so
//! that the manager's concurrency (its locks, counters, the extractor
//! thread of a batch load and the handoff of parts to the publisher) is
//! checked exhaustively under `RUSTFLAGS="--cfg loom"`: the code loom runs
//! is the code that runs in production, only these primitives differ.

#[cfg(loom)]
pub(crate) use loom::sync::atomic::AtomicU64;
#[cfg(loom)]
pub(crate) use loom::sync::{Arc, Condvar, Mutex, MutexGuard};
#[cfg(not(loom))]
pub(crate) use std::sync::atomic::AtomicU64;
#[cfg(not(loom))]
pub(crate) use std::sync::{Arc, Condvar, Mutex, MutexGuard};

/// Locks, recovering the data of a poisoned lock: every critical section of
/// the facade leaves its state consistent before anything that can panic.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn wait<'a, T>(ready: &Condvar, guard: MutexGuard<'a, T>) -> MutexGuard<'a, T> {
    ready.wait(guard).unwrap_or_else(|e| e.into_inner())
}

/// Runs `background` on a thread of its own (named `name`, with a stack of
/// `stack` bytes) while `foreground` runs on this one, and returns once
/// both are done; a panic of either goes on once both are. If no thread
/// can be had, neither runs and the error says why.
#[cfg(not(loom))]
pub(crate) fn beside(
    name: &str,
    stack: usize,
    background: impl FnOnce() + Send,
    foreground: impl FnOnce(),
) -> std::io::Result<()> {
    std::thread::scope(|scope| {
        std::thread::Builder::new()
            .name(name.into())
            .stack_size(stack)
            .spawn_scoped(scope, background)?;
        foreground();
        Ok(())
    })
}

/// loom 0.7 has no scoped threads (tokio-rs/loom#308), so the borrowing
/// closure is handed to a loom thread as `'static` and the thread is
/// joined before this returns, whatever happens.
#[cfg(loom)]
pub(crate) fn beside(
    name: &str,
    stack: usize,
    background: impl FnOnce() + Send,
    foreground: impl FnOnce(),
) -> std::io::Result<()> {
    /// Joins the thread when dropped, also while `foreground` unwinds.
    struct Joined(Option<loom::thread::JoinHandle<()>>);
    impl Drop for Joined {
        fn drop(&mut self) {
            if let Some(handle) = self.0.take() {
                let _ = handle.join();
            }
        }
    }
    let background: Box<dyn FnOnce() + Send + '_> = Box::new(background);
    // SAFETY: the thread is joined before this function returns or unwinds
    // (`Joined`), so nothing `background` borrows is used after it is gone;
    // only the lifetime changes, not the layout.
    let background: Box<dyn FnOnce() + Send + 'static> = unsafe { std::mem::transmute(background) };
    let handle = loom::thread::Builder::new()
        .name(name.into())
        .stack_size(stack)
        .spawn(background)?;
    let mut joined = Joined(Some(handle));
    foreground();
    if let Some(Err(panic)) = joined.0.take().map(|h| h.join()) {
        std::panic::resume_unwind(panic);
    }
    Ok(())
}

/// A queue of one item between two threads: [`Sender::send`] waits while
/// an item is queued, the [`Receiver`] yields items until the sender is
/// gone and the queue empty. Each side sees the other's drop.
pub(crate) fn handoff<T>() -> (Sender<T>, Receiver<T>) {
    let channel = Arc::new(Channel {
        state: Mutex::new(Queue {
            item: None,
            sender: true,
            receiver: true,
        }),
        changed: Condvar::new(),
    });
    (Sender(channel.clone()), Receiver(channel))
}

struct Channel<T> {
    state: Mutex<Queue<T>>,
    changed: Condvar,
}

struct Queue<T> {
    item: Option<T>,
    /// Whether each side is still there.
    sender: bool,
    receiver: bool,
}

pub(crate) struct Sender<T>(Arc<Channel<T>>);

pub(crate) struct Receiver<T>(Arc<Channel<T>>);

impl<T> Sender<T> {
    /// Queues `item` once the queue is empty; false (and `item` dropped)
    /// if the receiver is gone.
    pub(crate) fn send(&self, item: T) -> bool {
        let mut queue = lock(&self.0.state);
        loop {
            if !queue.receiver {
                return false;
            }
            if queue.item.is_none() {
                queue.item = Some(item);
                self.0.changed.notify_all();
                return true;
            }
            queue = wait(&self.0.changed, queue);
        }
    }
}

impl<T> Drop for Sender<T> {
    fn drop(&mut self) {
        lock(&self.0.state).sender = false;
        self.0.changed.notify_all();
    }
}

impl<T> Iterator for Receiver<T> {
    type Item = T;

    /// The next item, waiting for it; None once the sender is gone and
    /// nothing is queued.
    fn next(&mut self) -> Option<T> {
        let mut queue = lock(&self.0.state);
        loop {
            if let Some(item) = queue.item.take() {
                self.0.changed.notify_all();
                return Some(item);
            }
            if !queue.sender {
                return None;
            }
            queue = wait(&self.0.changed, queue);
        }
    }
}

impl<T> Drop for Receiver<T> {
    fn drop(&mut self) {
        let left = {
            let mut queue = lock(&self.0.state);
            queue.receiver = false;
            queue.item.take()
        };
        self.0.changed.notify_all();
        drop(left);
    }
}
