//! Shared by the models: how a model is run.

/// Under `--cfg loom`, explore every interleaving of `model` up to
/// `preemptions` preemptions; without it, run it `runs` times on real
/// threads as a stress test.
#[allow(unused_variables)]
pub fn check(preemptions: usize, runs: usize, model: impl Fn() + Sync + Send + 'static) {
    #[cfg(loom)]
    {
        let mut builder = loom::model::Builder::new();
        builder.preemption_bound = Some(preemptions);
        builder.check(model);
    }
    #[cfg(not(loom))]
    for _ in 0..runs {
        model();
    }
}
