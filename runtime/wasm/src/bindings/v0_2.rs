//! `baton:job@0.2.0` (`wit/baton-job.wit`): the current world.

wasmtime::component::bindgen!({
    path: "../../wit",
    world: "job",
    imports: { "baton:job/state": async },
    exports: { default: async },
});

super::impl_host!(manual = Manual);
