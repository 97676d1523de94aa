//! No per-message allocation on the hot path: a counting allocator watches a broker, a
//! publisher and a subscriber (all in this process) move 200,000 small messages, and the
//! allocations per message must stay far below one.
//!
//! This file holds a single test so that no other test allocates while it counts.

#![allow(clippy::unwrap_used)]

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use hayate_client::{Client, Key};

struct Counting;

static ALLOCS: AtomicU64 = AtomicU64::new(0);

#[allow(unsafe_code)]
// SAFETY: forwards to the system allocator unchanged; only counts calls.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(p, l, n) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

async fn pump(p: &Client, sub: &mut hayate_client::Subscription, key: &Key, n: u64) {
    let payload = Bytes::from(vec![7u8; 64]);
    let publisher = {
        let p = p.clone();
        let key = key.clone();
        tokio::spawn(async move {
            for _ in 0..n {
                p.publish(&key, payload.clone()).await.unwrap();
            }
            p.flush().await.unwrap();
        })
    };
    for _ in 0..n {
        sub.next().await.unwrap();
    }
    publisher.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allocations_per_message_stay_far_below_one() {
    let b = common::start_default().await;
    let s = Client::connect(&b.addr).await.unwrap();
    let mut sub = s.subscribe("alloc/x").await.unwrap();
    s.flush().await.unwrap();
    let p = Client::connect(&b.addr).await.unwrap();
    let key = Key::new("alloc/x").unwrap();
    // Warm up: route caches, buffers and channels reach their steady size.
    pump(&p, &mut sub, &key, 20_000).await;
    let n = 200_000;
    let before = ALLOCS.load(Ordering::Relaxed);
    common::within(120, pump(&p, &mut sub, &key, n)).await;
    let allocs = ALLOCS.load(Ordering::Relaxed) - before;
    let per_msg = allocs as f64 / n as f64;
    println!("{allocs} allocations for {n} messages: {per_msg:.4} per message");
    // Publisher, broker and subscriber together: allocations happen per read, per batch
    // frame and per channel hand-off, never per message.
    assert!(per_msg < 0.1, "{per_msg} allocations per message");
}
