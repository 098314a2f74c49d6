//! The tests' bounded wait, for the binaries that share no other helper (`#[path]`-included).

use std::time::{Duration, Instant};

/// Polls `f` every 100 ms until it returns `Some`, and returns that; fails the test, naming
/// `what`, when `bound` has passed.
pub async fn until<F, Fut, T>(what: &str, bound: Duration, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + bound;
    loop {
        if let Some(t) = f().await {
            return t;
        }
        assert!(Instant::now() < deadline, "{what}: not within {bound:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
