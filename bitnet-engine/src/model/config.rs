//! Model hyperparameters and the presets with real BitNet shapes.

use std::fmt;
use std::str::FromStr;

use crate::error::{Error, Result};

pub use crate::ops::FfnActivation;

/// Where a model's FFN activation was decided: users compare our figures with llama.cpp's and
/// bitnet.cpp's, which decide it differently for the same file, so every tool says which rule won.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum ActivationSource {
    /// A metadata key of the file named it (the key).
    MetadataKey(String),
    /// The file's `general.architecture` (the name), through the same table llama.cpp uses.
    Architecture(String),
    /// `--ffn-activation` on the command line.
    Flag,
    /// The preset's definition (synthetic weights).
    Preset,
}

impl fmt::Display for ActivationSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ActivationSource::MetadataKey(k) => write!(f, "metadata key {k}"),
            ActivationSource::Architecture(a) => write!(f, "architecture {a}"),
            ActivationSource::Flag => f.write_str("--ffn-activation"),
            ActivationSource::Preset => f.write_str("preset"),
        }
    }
}

/// Hyperparameters of a BitNet b1.58 decoder (LLaMA-style).
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    pub name: String,
    /// Model width (d_model).
    pub hidden: usize,
    /// Feed-forward width.
    pub ffn: usize,
    pub layers: usize,
    /// Query heads.
    pub heads: usize,
    /// Key/value heads (grouped-query attention when < heads).
    pub kv_heads: usize,
    pub vocab: usize,
    /// Longest context the model supports.
    pub max_context: usize,
    /// RoPE base frequency θ.
    pub rope_theta: f32,
    /// RMSNorm epsilon.
    pub norm_eps: f32,
    pub activation: FfnActivation,
    /// Which rule chose `activation`.
    pub activation_source: ActivationSource,
    /// Whether the layers have `attn_sub_norm` (before the O projection) and `ffn_sub_norm`
    /// (before the down projection), as BitNet b1.58 models do.
    pub sub_norms: bool,
    /// Whether the LM head reuses the token embedding.
    pub tied_embeddings: bool,
}

/// The presets `ModelConfig::preset` knows.
pub const PRESETS: [&str; 5] =
    ["bitnet-b1.58-large", "bitnet-b1.58-3b", "bitnet-b1.58-2b-4t", "llama3-8b-1.58", "tiny"];

impl ModelConfig {
    /// A preset by name: the real shapes of the public BitNet b1.58 models, and `tiny` for tests.
    pub fn preset(name: &str) -> Result<Self> {
        let c = |hidden, ffn, layers, heads, kv_heads, vocab, max_context, rope_theta, activation, tied| ModelConfig {
            name: name.to_string(),
            hidden,
            ffn,
            layers,
            heads,
            kv_heads,
            vocab,
            max_context,
            rope_theta,
            norm_eps: 1e-5,
            activation,
            activation_source: ActivationSource::Preset,
            sub_norms: true,
            tied_embeddings: tied,
        };
        use FfnActivation::*;
        let cfg = match name {
            "bitnet-b1.58-large" => c(1536, 4096, 24, 16, 16, 32002, 2048, 10_000.0, Silu, true),
            "bitnet-b1.58-3b" => c(3200, 8640, 26, 32, 32, 32002, 2048, 10_000.0, Silu, true),
            "bitnet-b1.58-2b-4t" => c(2560, 6912, 30, 20, 5, 128_256, 4096, 500_000.0, ReluSquared, true),
            // Llama 3 8B shapes with ternary linear layers (HF1BitLLM): separate LM head.
            "llama3-8b-1.58" => c(4096, 14336, 32, 32, 8, 128_256, 8192, 500_000.0, Silu, false),
            "tiny" => c(256, 512, 2, 4, 2, 512, 256, 10_000.0, ReluSquared, true),
            _ => {
                return Err(Error::UnknownName {
                    what: "model preset",
                    got: name.to_string(),
                    expected: PRESETS.join(", "),
                })
            }
        };
        cfg.validate()?;
        Ok(cfg)
    }

    /// Head dimension.
    pub fn head_dim(&self) -> usize {
        self.hidden / self.heads
    }

    /// Width of the Q projection (= hidden) and of the K/V projections.
    pub fn q_dim(&self) -> usize {
        self.heads * self.head_dim()
    }
    pub fn kv_dim(&self) -> usize {
        self.kv_heads * self.head_dim()
    }

    /// The distinct shapes of a layer's seven BitLinear matmuls as (name, N outputs, K inputs),
    /// in layer order; projections of equal shape share one entry, named by all of them
    /// (`q/o 2560x2560` and `k/v 640x2560` for 2B4T, `q/k/v/o 1536x1536` for large).
    pub fn linear_shapes(&self) -> Vec<(String, usize, usize)> {
        let (h, q, kv, f) = (self.hidden, self.q_dim(), self.kv_dim(), self.ffn);
        let all = [("q", q, h), ("k", kv, h), ("v", kv, h), ("o", h, q), ("gate", f, h), ("up", f, h), ("down", h, f)];
        let mut shapes: Vec<(String, usize, usize)> = Vec::new();
        for (name, n, k) in all {
            match shapes.iter_mut().find(|(_, sn, sk)| (*sn, *sk) == (n, k)) {
                Some(s) => s.0 = format!("{}/{}", s.0, name),
                None => shapes.push((name.to_string(), n, k)),
            }
        }
        for s in &mut shapes {
            s.0 = format!("{} {}x{}", s.0, s.1, s.2);
        }
        shapes
    }

    /// Checks the shapes fit together, naming the field that does not.
    pub fn validate(&self) -> Result<()> {
        let bad = |what: String| Err(Error::Shape(format!("model '{}': {what}", self.name)));
        for (field, v) in [
            ("hidden", self.hidden),
            ("ffn", self.ffn),
            ("layers", self.layers),
            ("heads", self.heads),
            ("kv_heads", self.kv_heads),
            ("vocab", self.vocab),
            ("max_context", self.max_context),
        ] {
            if v == 0 {
                return bad(format!("{field} must be > 0"));
            }
        }
        if !self.hidden.is_multiple_of(self.heads) {
            return bad(format!("hidden ({}) must be a multiple of heads ({})", self.hidden, self.heads));
        }
        if !self.heads.is_multiple_of(self.kv_heads) {
            return bad(format!("heads ({}) must be a multiple of kv_heads ({})", self.heads, self.kv_heads));
        }
        if self.head_dim() > crate::attention::MAX_HEAD_DIM {
            return bad(format!(
                "head dimension ({}) is above the supported {}",
                self.head_dim(),
                crate::attention::MAX_HEAD_DIM
            ));
        }
        if !self.head_dim().is_multiple_of(2) {
            return bad(format!("head dimension ({}) must be even for RoPE", self.head_dim()));
        }
        if !(self.rope_theta > 0.0 && self.norm_eps > 0.0) {
            return bad("rope_theta and norm_eps must be > 0".into());
        }
        Ok(())
    }

    /// Ternary weights in the linear layers.
    pub fn linear_params(&self) -> usize {
        let attn = self.hidden * (self.q_dim() + 2 * self.kv_dim()) + self.q_dim() * self.hidden;
        let ffn = 3 * self.hidden * self.ffn;
        self.layers * (attn + ffn)
    }

    /// Runs the FFN with `activation` whatever the file or preset says (`--ffn-activation`).
    pub fn override_activation(&mut self, activation: FfnActivation) {
        self.activation = activation;
        self.activation_source = ActivationSource::Flag;
    }

    /// Parameters of the embedding and (if untied) the LM head.
    pub fn embedding_params(&self) -> usize {
        self.vocab * self.hidden * if self.tied_embeddings { 1 } else { 2 }
    }
}

impl fmt::Display for ModelConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: hidden {}, ffn {}, {} layers, {} heads ({} kv), vocab {}, {}",
            self.name,
            self.hidden,
            self.ffn,
            self.layers,
            self.heads,
            self.kv_heads,
            self.vocab,
            self.activation.name()
        )
    }
}

impl FromStr for ModelConfig {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        Self::preset(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_have_the_published_shapes() {
        let m = ModelConfig::preset("bitnet-b1.58-2b-4t").unwrap();
        assert_eq!((m.hidden, m.ffn, m.layers, m.heads, m.kv_heads, m.vocab), (2560, 6912, 30, 20, 5, 128_256));
        assert_eq!((m.head_dim(), m.kv_dim()), (128, 640));
        // ~2.09 G ternary weights in the linear layers of 2B4T.
        assert_eq!(m.linear_params(), 30 * (2560 * (2560 + 2 * 640) + 2560 * 2560 + 3 * 2560 * 6912));
        for p in PRESETS {
            ModelConfig::preset(p).unwrap();
        }
    }

    #[test]
    fn linear_shapes_merge_equal_projections() {
        let names = |p: &str| -> Vec<String> {
            ModelConfig::preset(p).unwrap().linear_shapes().into_iter().map(|s| s.0).collect()
        };
        assert_eq!(
            names("bitnet-b1.58-2b-4t"),
            ["q/o 2560x2560", "k/v 640x2560", "gate/up 6912x2560", "down 2560x6912"]
        );
        assert_eq!(names("bitnet-b1.58-large"), ["q/k/v/o 1536x1536", "gate/up 4096x1536", "down 1536x4096"]);
        let shapes = ModelConfig::preset("llama3-8b-1.58").unwrap().linear_shapes();
        assert_eq!(shapes[1], ("k/v 1024x4096".to_string(), 1024, 4096));
    }

    #[test]
    fn unknown_preset_lists_the_known_ones() {
        let e = ModelConfig::preset("gpt2").unwrap_err().to_string();
        assert!(e.contains("gpt2") && e.contains("bitnet-b1.58-2b-4t") && e.contains("tiny"), "{e}");
    }

    #[test]
    fn validation_names_the_field() {
        let mut m = ModelConfig::preset("tiny").unwrap();
        m.kv_heads = 3;
        assert!(m.validate().unwrap_err().to_string().contains("kv_heads"));
    }
}
