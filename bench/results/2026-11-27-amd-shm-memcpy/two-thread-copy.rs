use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;
const MIB: usize = 1 << 20;
const SLOTS: usize = 17;
struct Ring { data: Vec<AtomicU64>, head: AtomicUsize, tail: AtomicUsize }
fn run(atomic: bool, n: usize) -> f64 {
    let r = Arc::new(Ring { data: (0..SLOTS * MIB / 8).map(|_| AtomicU64::new(0)).collect(), head: AtomicUsize::new(0), tail: AtomicUsize::new(0) });
    let r2 = r.clone();
    let t = Instant::now();
    let reader = std::thread::spawn(move || {
        let mut dst = vec![0u8; MIB];
        let mut acc = 0u64;
        for i in 0..n {
            while r2.head.load(Ordering::Acquire) <= i { std::hint::spin_loop(); }
            let s = (i % SLOTS) * MIB / 8;
            if atomic {
                let mut buf = [0u64; 64];
                for k in 0..(MIB / 8 / 64) {
                    for j in 0..64 { buf[j] = r2.data[s + k * 64 + j].load(Ordering::Relaxed); }
                    let b: &[u8] = unsafe { std::slice::from_raw_parts(buf.as_ptr() as *const u8, 512) };
                    dst[k * 512..k * 512 + 512].copy_from_slice(b);
                }
            } else {
                let p = r2.data[s..].as_ptr() as *const u8;
                unsafe { std::ptr::copy_nonoverlapping(p, dst.as_mut_ptr(), MIB) };
            }
            acc ^= dst[i % MIB] as u64;
            r2.tail.store(i + 1, Ordering::Release);
        }
        acc
    });
    let src = vec![7u8; MIB];
    let words: Vec<u64> = src.chunks(8).map(|c| u64::from_le_bytes(c.try_into().unwrap())).collect();
    for i in 0..n {
        while i >= r.tail.load(Ordering::Acquire) + SLOTS { std::hint::spin_loop(); }
        let s = (i % SLOTS) * MIB / 8;
        if atomic {
            for (j, w) in words.iter().enumerate() { r.data[s + j].store(*w, Ordering::Relaxed); }
        } else {
            let p = r.data[s..].as_ptr() as *mut u8;
            unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), p, MIB) };
        }
        r.head.store(i + 1, Ordering::Release);
    }
    reader.join().unwrap();
    (n * MIB * 8) as f64 / t.elapsed().as_secs_f64() / 1e9
}
fn main() {
    for _ in 0..3 {
        println!("atomic words: {:.1} Gbit/s   memcpy: {:.1} Gbit/s", run(true, 10000), run(false, 10000));
    }
}
