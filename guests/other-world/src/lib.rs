//! A component of another world: it exports `start`, not `run`, and imports nothing of
//! `baton:job`. Baton must refuse to load it and say what is missing.

wit_bindgen::generate!({ path: "wit", world: "other" });

struct Other;

impl Guest for Other {
    fn start(n: u32) -> u32 {
        n + 1
    }
}

export!(Other);
