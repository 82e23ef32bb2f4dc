//! Where a model comes from: a preset name (synthetic weights) or a GGUF file — the `--model`
//! argument every tool takes.

use std::path::{Path, PathBuf};

use super::load_model;
use crate::error::{Error, Result};
use crate::formats::WeightFormat;
use crate::model::{tensor_layout, FfnActivation, Model, ModelConfig, Weights};

/// A preset (synthetic weights) or a GGUF file.
#[derive(Debug, Clone)]
pub enum ModelSource {
    Preset(ModelConfig),
    Gguf(PathBuf),
}

impl ModelSource {
    /// A path ending in `.gguf` or naming a file is a GGUF file; anything else must be a preset.
    pub fn parse(spec: &str) -> Result<Self> {
        if spec.ends_with(".gguf") || Path::new(spec).is_file() {
            if !Path::new(spec).is_file() {
                return Err(Error::Value(format!("{spec}: no such file")));
            }
            return Ok(ModelSource::Gguf(PathBuf::from(spec)));
        }
        ModelConfig::preset(spec).map(ModelSource::Preset)
    }

    /// Loads the model (synthetic weights in `format` for a preset, generated on `threads`
    /// threads from `seed`), and says where it came from. `activation` (`--ffn-activation`)
    /// overrides the FFN gating the file or preset gives.
    pub fn load(
        &self,
        format: WeightFormat,
        seed: u64,
        threads: usize,
        activation: Option<FfnActivation>,
    ) -> Result<(Model, String)> {
        let (mut model, desc) = match self {
            ModelSource::Preset(cfg) => {
                tensor_layout(cfg, format)?;
                let weights = Weights::synthetic(cfg, format, seed, threads)?;
                (Model::new(cfg.clone(), weights), format!("preset (synthetic {format} weights, seed {seed})"))
            }
            ModelSource::Gguf(path) => (load_model(path)?, format!("GGUF file {}", path.display())),
        };
        if let Some(a) = activation {
            model.config.override_activation(a);
        }
        Ok((model, desc))
    }
}
