//! A component that exports both `run` (the `baton:job` world, through the guest SDK) and
//! `wasi:cli/run` (its `main`): Baton runs it as a `baton:job` component, calling `run`. Each
//! entry point says which one ran.

baton_guest::job!(|info| {
    println!("run ran for {}", info.job);
    Ok(())
});

fn main() {
    println!("main ran");
}
