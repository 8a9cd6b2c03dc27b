//! Allocates 1 MiB blocks (and touches them) until something gives: the host's memory cap.

use std::hint::black_box;

baton_guest::job!(|_info| {
    let mut blocks: Vec<Vec<u8>> = Vec::new();
    loop {
        blocks.push(black_box(vec![1u8; 1 << 20]));
    }
});
