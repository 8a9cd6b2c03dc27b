//! `baton:job@0.1.0` (`wit/v0.1.0/baton-job.wit`): frozen; its components load and run unchanged.

wasmtime::component::bindgen!({
    path: "../../wit/v0.1.0",
    world: "job",
    exports: { default: async },
});

super::impl_host!(manual = Scheduled);
