//! Spins forever and never asks `signal_aborted()`: only the host's epoch interruption can
//! stop it.

use std::hint::black_box;

baton_guest::job!(|_info| {
    let mut n: u64 = 0;
    loop {
        n = black_box(n.wrapping_mul(6364136223846793005).wrapping_add(1));
    }
});
