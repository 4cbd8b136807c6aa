//! Test engines shared by the integration tests (`mod common;`).

#![allow(dead_code)]

use anyhow::Result;
use lockstep::engine::{Engine, EngineInfo, LockstepEngine};
use lockstep_engine::hooks::StageSink;
use lockstep_engine::ops::GgmlTarget;
use lockstep_engine::{NumericsMode, Stage};
use ndarray::Array2;

/// Our engine, with a sink wrapper that corrupts one stage.
pub struct Corrupting {
    /// The engine.
    pub inner: LockstepEngine,
    /// The stage whose middle element is overwritten.
    pub target: Stage,
    /// What it is overwritten with.
    pub value: f32,
}

struct CorruptSink<'a> {
    inner: &'a mut dyn StageSink,
    target: Stage,
    value: f32,
}

impl StageSink for CorruptSink<'_> {
    fn on_stage(
        &mut self,
        stage: Stage,
        positions: std::ops::Range<usize>,
        width: usize,
        data: &mut [f32],
    ) {
        if stage == self.target {
            data[width / 2] = self.value;
        }
        if self.inner.wants(stage) {
            self.inner.on_stage(stage, positions, width, data);
        }
    }
}

impl Engine for Corrupting {
    fn info(&self) -> EngineInfo {
        self.inner.info()
    }
    fn tokenize(&mut self, text: &str, a: bool, p: bool) -> Result<Vec<u32>> {
        self.inner.tokenize(text, a, p)
    }
    fn stages(&self) -> Vec<(String, usize)> {
        self.inner.stages()
    }
    fn reset(&mut self, mode: NumericsMode, target: GgmlTarget, n_ctx: usize) -> Result<()> {
        self.inner.reset(mode, target, n_ctx)
    }
    fn forward(&mut self, tokens: &[u32], sink: &mut dyn StageSink) -> Result<Array2<f32>> {
        let mut s = CorruptSink {
            inner: sink,
            target: self.target,
            value: self.value,
        };
        self.inner.forward(tokens, &mut s)
    }
}
