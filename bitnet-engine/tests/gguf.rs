//! GGUF reading and loading against a fixture written by the official `gguf` Python package
//! (`data/make_tiny_gguf.py`), and malformed files: every one gives an error, none a panic.

use bitnet_engine::formats::PackedWeights;
use bitnet_engine::gguf::types::{decode_f32, decode_q6k_block};
use bitnet_engine::gguf::{load_model, GgufFile};
use bitnet_engine::model::reference::reference_logits;
use bitnet_engine::model::{greedy, FfnActivation};
use bitnet_engine::{KvPrecision, State, StateOptions, WeightFormat};
use sha2::{Digest, Sha256};

fn data_path(name: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data").join(name)
}

fn read(name: &str) -> Vec<u8> {
    std::fs::read(data_path(name)).unwrap_or_else(|e| panic!("fixture {name}: {e}"))
}

fn expected() -> serde_json::Value {
    serde_json::from_slice(&read("tiny-bitnet.expected.json")).unwrap()
}

fn sha_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

#[test]
fn q6_k_blocks_decode_exactly_as_the_gguf_package_does() {
    let blocks = read("q6k_vectors.bin");
    let want: Vec<f32> =
        read("q6k_vectors.f32").chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect();
    assert_eq!((blocks.len(), want.len()), (4 * 210, 4 * 256));
    let mut got = vec![0f32; 256];
    for b in 0..4 {
        decode_q6k_block(&blocks[b * 210..(b + 1) * 210], &mut got);
        for i in 0..256 {
            assert_eq!(got[i].to_bits(), want[b * 256 + i].to_bits(), "block {b} value {i}");
        }
    }
}

#[test]
fn fixture_metadata_and_every_tensor_decode_as_written() {
    let bytes = read("tiny-bitnet.gguf");
    let exp = expected();
    let f = GgufFile::parse(&bytes).unwrap();
    assert_eq!(f.version, exp["gguf_version"].as_u64().unwrap() as u32);
    assert_eq!(f.data_offset as u64, exp["data_offset"].as_u64().unwrap());
    assert_eq!(f.tensors.len() as u64, exp["tensor_count"].as_u64().unwrap());
    assert_eq!(f.get("general.architecture").unwrap().as_str(), Some("bitnet"));
    assert_eq!(f.get("bitnet.block_count").unwrap().as_u64(), Some(2));
    let model = load_model(&data_path("tiny-bitnet.gguf")).unwrap();
    let cfg = &model.config;
    assert_eq!((cfg.hidden, cfg.ffn, cfg.layers, cfg.heads, cfg.kv_heads, cfg.vocab), (256, 512, 2, 4, 2, 512));
    assert_eq!((cfg.activation, cfg.sub_norms, cfg.tied_embeddings), (FfnActivation::Silu, true, true));
    assert_eq!(cfg.norm_eps, 1e-5);
    for t in exp["tensors"].as_array().unwrap() {
        let name = t["name"].as_str().unwrap();
        let desc = f.tensor(name).unwrap_or_else(|| panic!("{name} missing"));
        assert_eq!(desc.ggml_type.name(), t["type"].as_str().unwrap(), "{name}");
        assert_eq!(desc.size as u64, t["nbytes"].as_u64().unwrap(), "{name}");
        let dims: Vec<u64> = t["ne"].as_array().unwrap().iter().map(|d| d.as_u64().unwrap()).collect();
        assert_eq!(desc.dims, dims, "{name}");
        assert_eq!(sha_hex(f.data(desc)), t["sha256_raw"].as_str().unwrap(), "{name} raw bytes");
        let decoded: Vec<u8> = if name.starts_with("blk.") && desc.dims.len() == 2 {
            // Ternary values of the loaded model's packed layer, row-major.
            let l: usize = name.split('.').nth(1).unwrap().parse().unwrap();
            let lw = &model.weights.layers[l];
            let w: &PackedWeights = match name.split('.').nth(2).unwrap() {
                "attn_q" => &lw.wq,
                "attn_k" => &lw.wk,
                "attn_v" => &lw.wv,
                "attn_output" => &lw.wo,
                "ffn_gate" => &lw.w_gate,
                "ffn_up" => &lw.w_up,
                "ffn_down" => &lw.w_down,
                other => panic!("unexpected {other}"),
            };
            assert_eq!(w.format(), if l == 0 { WeightFormat::Tq2_0 } else { WeightFormat::Tq1_0 });
            w.unpack().values.iter().map(|v| *v as u8).collect()
        } else {
            let mut out = vec![0f32; desc.elements() as usize];
            decode_f32(desc.ggml_type, f.data(desc), &mut out).unwrap();
            out.iter().flat_map(|v| v.to_le_bytes()).collect()
        };
        assert_eq!(sha_hex(&decoded), t["sha256_decoded"].as_str().unwrap(), "{name} decoded values");
    }
}

#[test]
fn fixture_model_runs_and_matches_the_reference() {
    let model = load_model(&data_path("tiny-bitnet.gguf")).unwrap();
    let prompt = [1u32, 45, 300, 7];
    let mut st = State::new(&model, &StateOptions::new(1, 64, KvPrecision::F32, 2)).unwrap();
    let g = greedy(&model, &mut st, &prompt, 12, true).unwrap();
    let mut seq = prompt.to_vec();
    seq.extend(&g.tokens[..11]);
    let r = reference_logits(&model, &seq);
    for (i, (a, b)) in r.iter().zip(&g.logits).enumerate() {
        let dot: f64 = a.iter().zip(b).map(|(x, y)| *x as f64 * *y as f64).sum();
        let n = |v: &[f32]| v.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
        let cos = dot / (n(a) * n(b));
        assert!(cos >= 0.999, "position {i}: cosine {cos}");
    }
}

/// Parses, then builds the model: must return (never panic) for any input.
fn try_load(bytes: &[u8]) -> Result<(), String> {
    let f = GgufFile::parse(bytes).map_err(|e| e.to_string())?;
    bitnet_engine::gguf::load::model_from_gguf(&f, "fuzz").map(|_| ()).map_err(|e| e.to_string())
}

#[test]
fn every_truncation_is_an_error_that_says_where() {
    let bytes = read("tiny-bitnet.gguf");
    let data_offset = GgufFile::parse(&bytes).unwrap().data_offset;
    for len in (0..data_offset + 64).chain([bytes.len() - 1000, bytes.len() - 1]) {
        let e = try_load(&bytes[..len]).expect_err(&format!("{len} bytes parsed"));
        assert!(!e.is_empty());
        if len > data_offset {
            assert!(e.contains("past the end of the file") && e.contains("tensor '"), "{len}: {e}");
        }
    }
}

#[test]
fn corrupted_bytes_never_panic() {
    let bytes = read("tiny-bitnet.gguf");
    let header = GgufFile::parse(&bytes).unwrap().data_offset;
    let mut rng = bitnet_engine::rng::SplitMix64::new(99);
    for _ in 0..3000 {
        let mut b = bytes[..header + 4096].to_vec();
        for _ in 0..1 + rng.below(4) {
            let i = rng.below(header as u32 + 64) as usize;
            b[i] = rng.next_u64() as u8;
        }
        let _ = try_load(&b);
    }
}

#[test]
fn malformed_headers_name_what_is_wrong() {
    let bytes = read("tiny-bitnet.gguf");
    let mut bad = bytes.clone();
    bad[..4].copy_from_slice(b"GGML");
    assert!(try_load(&bad).unwrap_err().contains("magic"));
    let mut bad = bytes.clone();
    bad[4..8].copy_from_slice(&99u32.to_le_bytes());
    assert!(try_load(&bad).unwrap_err().contains("version 99"));
    let mut bad = bytes.clone();
    bad[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(try_load(&bad).unwrap_err().contains("tensors"));
    // Rename the architecture: "bitnet" → "llama!" (same length).
    let pos = bytes.windows(6).position(|w| w == b"bitnet").unwrap();
    let mut bad = bytes.clone();
    bad[pos..pos + 6].copy_from_slice(b"llama!");
    let e = try_load(&bad).unwrap_err();
    assert!(e.contains("llama!") && e.contains("general.architecture"), "{e}");
    // Break a hyperparameter: block_count → 3 (a tensor is then missing).
    let key = b"bitnet.block_count";
    let kpos = bytes.windows(key.len()).position(|w| w == key).unwrap() + key.len();
    let mut bad = bytes.clone();
    bad[kpos + 4..kpos + 8].copy_from_slice(&3u32.to_le_bytes());
    let e = try_load(&bad).unwrap_err();
    assert!(e.contains("blk.2.") && e.contains("missing"), "{e}");
    // A file that is not there names the path.
    let e = load_model(std::path::Path::new("/nonexistent/x.gguf")).unwrap_err().to_string();
    assert!(e.contains("/nonexistent/x.gguf"), "{e}");
}

#[test]
fn saved_models_load_back_with_the_same_weights() {
    let scratch = tmp("save");
    let dir = scratch.path();
    let original = bitnet_engine::Model::synthetic("tiny", WeightFormat::I2, 5, 2).unwrap();
    for format in [WeightFormat::Tq2_0, WeightFormat::Tq1_0] {
        let path = dir.join(format!("tiny-{format}.gguf"));
        bitnet_engine::gguf::save_model(&original, format, &path).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        let f = GgufFile::parse(&bytes).unwrap();
        assert_eq!(
            f.get("tokenizer.ggml.tokens").map(|v| matches!(v, bitnet_engine::gguf::Value::Array(a) if a.len() == 512)),
            Some(true)
        );
        let loaded = load_model(&path).unwrap();
        assert_eq!(loaded.config.hidden, original.config.hidden);
        assert_eq!(loaded.config.layers, original.config.layers);
        for (a, b) in original.weights.layers.iter().zip(&loaded.weights.layers) {
            for (x, y) in a.linears().iter().zip(b.linears()) {
                assert_eq!(y.format(), format);
                assert_eq!(x.unpack().values, y.unpack().values);
            }
            assert_eq!(a.attn_norm, b.attn_norm);
        }
        // Logits stay close: only the embedding went int8 → f16 → int8.
        let mut s1 = State::new(&original, &StateOptions::new(1, 16, KvPrecision::F32, 1)).unwrap();
        let mut s2 = State::new(&loaded, &StateOptions::new(1, 16, KvPrecision::F32, 1)).unwrap();
        let g1 = greedy(&original, &mut s1, &[1, 2, 3], 4, true).unwrap();
        let g2 = greedy(&loaded, &mut s2, &[1, 2, 3], 4, true).unwrap();
        for (a, b) in g1.logits.iter().zip(&g2.logits) {
            let dot: f64 = a.iter().zip(b).map(|(x, y)| *x as f64 * *y as f64).sum();
            let n = |v: &[f32]| v.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
            let cos = dot / (n(a) * n(b));
            assert!(cos > 0.99, "{format}: cosine {cos}");
        }
    }
    let e = bitnet_engine::gguf::save_model(&original, WeightFormat::BitPlanes, &dir.join("x.gguf"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("TQ2_0") && e.contains("I2_S"), "{e}");
    assert!(!dir.join("x.gguf").exists());
}

/// A Q6_K embedding (what llama.cpp's quantizer writes for BitNet models) is kept as stored:
/// `--save-gguf` writes its blocks as they are, loading reads them back byte for byte, and the
/// loaded model's logits equal the original's bit for bit; a block with a non-finite scale is
/// refused by tensor name.
#[test]
fn q6_k_embeddings_are_run_and_saved_as_stored() {
    use bitnet_engine::formats::{EmbeddingRows, Q6kRows};
    let scratch = tmp("q6k");
    let dir = scratch.path();
    let mut model = bitnet_engine::Model::synthetic("tiny", WeightFormat::Tq2_0, 9, 2).unwrap();
    let (vocab, hidden) = (model.config.vocab, model.config.hidden);
    model.weights.token_embd = Q6kRows::random(vocab, hidden, 2e-4, 11).unwrap().into();
    let path = dir.join("q6k.gguf");
    bitnet_engine::gguf::save_model(&model, WeightFormat::Tq2_0, &path).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    let f = GgufFile::parse(&bytes).unwrap();
    let t = f.tensor("token_embd.weight").unwrap();
    assert_eq!(t.ggml_type.name(), "Q6_K");
    let EmbeddingRows::Q6K(stored) = &model.weights.token_embd else { unreachable!() };
    assert_eq!(f.data(t), stored.as_bytes());
    let loaded = load_model(&path).unwrap();
    assert_eq!(loaded.weights.token_embd, model.weights.token_embd);
    assert_eq!(loaded.weights.bytes_read_per_token(), model.weights.bytes_read_per_token());
    let prompt = [3u32, 1, 4, 1, 5];
    let logits = |m: &bitnet_engine::Model| {
        let mut st = State::new(m, &StateOptions::new(1, 16, KvPrecision::F32, 2)).unwrap();
        greedy(m, &mut st, &prompt, 4, true).unwrap().logits
    };
    let bits = |l: Vec<Vec<f32>>| l.into_iter().flatten().map(f32::to_bits).collect::<Vec<_>>();
    assert_eq!(bits(logits(&loaded)), bits(logits(&model)));
    // d of token 7's first block → NaN: refused, naming the tensor, the row and the block.
    let at = f.data_offset + t.offset as usize + 7 * 210 + 208;
    let mut bad = bytes.clone();
    bad[at..at + 2].copy_from_slice(&0x7E00u16.to_le_bytes());
    let e = try_load(&bad).unwrap_err();
    assert!(e.contains("token_embd.weight") && e.contains("row 7, block 0") && e.contains("non-finite"), "{e}");
}

#[test]
fn projection_scale_tensors_load_and_scale_outputs() {
    // llama.cpp's `bitnet` models may carry blk.N.<proj>.scale: one F32 that multiplies the
    // projection's output (conversions that keep ternary weights and their scales apart).
    let scratch = tmp("scale");
    let dir = scratch.path();
    let mut model = bitnet_engine::Model::synthetic("tiny", WeightFormat::Tq2_0, 8, 2).unwrap();
    model.weights.layers[0].out_scales = [0.5, 2.0, 1.0, 0.25, 1.5, 0.75, 3.0];
    model.weights.layers[1].out_scales[6] = 0.125;
    let path = dir.join("scaled.gguf");
    bitnet_engine::gguf::save_model(&model, WeightFormat::Tq2_0, &path).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    let f = GgufFile::parse(&bytes).unwrap();
    let t = f.tensor("blk.0.attn_q.scale").expect("scales other than 1 are written");
    assert_eq!(t.dims, [1]);
    assert!(f.tensor("blk.0.attn_v.scale").is_none(), "a scale of 1 is not written");
    let loaded = load_model(&path).unwrap();
    for (a, b) in model.weights.layers.iter().zip(&loaded.weights.layers) {
        assert_eq!(a.out_scales, b.out_scales);
    }
    // The fast forward applies them as the f64 reference does.
    let prompt = [3u32, 1, 4, 1, 5];
    let mut st = State::new(&loaded, &StateOptions::new(1, 16, KvPrecision::F32, 2)).unwrap();
    let g = greedy(&loaded, &mut st, &prompt, 1, true).unwrap();
    let r = reference_logits(&loaded, &prompt);
    let cos = |a: &[f32], b: &[f32]| {
        let dot: f64 = a.iter().zip(b).map(|(x, y)| *x as f64 * *y as f64).sum();
        let n = |v: &[f32]| v.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
        dot / (n(a) * n(b))
    };
    for (i, (a, b)) in r.iter().zip(&g.logits).enumerate() {
        assert!(cos(a, b) >= 0.999, "position {i}: cosine {}", cos(a, b));
    }
    // And they matter: without them the logits move.
    let mut plain = loaded.clone();
    plain.weights.layers.iter_mut().for_each(|l| l.out_scales = [1.0; 7]);
    let mut st = State::new(&plain, &StateOptions::new(1, 16, KvPrecision::F32, 2)).unwrap();
    let g2 = greedy(&plain, &mut st, &prompt, 1, true).unwrap();
    assert!(cos(&g.logits[4], &g2.logits[4]) < 0.999);
    // A scale tensor of no projection, or with more than one element, is refused by name.
    let name = b"blk.0.attn_q.scale";
    let pos = bytes.windows(name.len()).position(|w| w == name).unwrap();
    let mut bad = bytes.clone();
    bad[pos..pos + name.len()].copy_from_slice(b"blk.0.attn_x.scale");
    let e = try_load(&bad).unwrap_err();
    assert!(e.contains("blk.0.attn_x.scale") && e.contains("no projection"), "{e}");
    let mut bad = bytes.clone();
    // After the name: n_dims (u32) = 1, then dims[0] (u64) = 1 → 2.
    let dim = pos + name.len() + 4;
    bad[dim..dim + 8].copy_from_slice(&2u64.to_le_bytes());
    let e = try_load(&bad).unwrap_err();
    assert!(e.contains("blk.0.attn_q.scale"), "{e}");
}

#[test]
fn fuzz_regressions_are_errors() {
    // Inputs the fuzzer (fuzz/) once crashed on: each must now load or fail cleanly.
    let dir = data_path("fuzz-regressions");
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "md") {
            continue;
        }
        let _ = try_load(&std::fs::read(&path).unwrap());
        n += 1;
    }
    eprintln!("{n} fuzz regression inputs replayed");
}

/// Every tensor of a parsed file as a `RawTensor`, to write it back changed.
fn raw_tensors(f: &GgufFile<'_>) -> Vec<bitnet_engine::gguf::writer::RawTensor> {
    f.tensors
        .iter()
        .map(|t| bitnet_engine::gguf::writer::RawTensor {
            name: t.name.clone(),
            dims: t.dims.clone(),
            ty: t.ggml_type,
            data: f.data(t).to_vec(),
        })
        .collect()
}

/// A fresh, uniquely named scratch directory, removed when dropped (pass or fail).
fn tmp(tag: &str) -> tempfile::TempDir {
    tempfile::Builder::new().prefix(&format!("bitnet-gguf-{tag}-")).tempdir().unwrap()
}

/// `path` rewritten with `edit` applied to its metadata (tensors unchanged), as `out`.
fn with_metadata(
    path: &std::path::Path,
    out: &std::path::Path,
    edit: impl FnOnce(&mut Vec<(String, bitnet_engine::gguf::Value)>),
) {
    let bytes = std::fs::read(path).unwrap();
    let f = GgufFile::parse(&bytes).unwrap();
    let mut meta = f.metadata.clone();
    edit(&mut meta);
    bitnet_engine::gguf::writer::write_raw(out, &meta, &raw_tensors(&f)).unwrap();
}

/// Renames architecture `from` to `to` in the metadata: `general.architecture` and every
/// `from.*` key.
fn rename_arch(meta: &mut [(String, bitnet_engine::gguf::Value)], from: &str, to: &str) {
    for (k, v) in meta.iter_mut() {
        if k == "general.architecture" {
            *v = bitnet_engine::gguf::Value::String(to.into());
        } else if let Some(rest) = k.strip_prefix(&format!("{from}.")) {
            *k = format!("{to}.{rest}");
        }
    }
}

#[test]
fn the_ffn_activation_follows_the_key_then_the_architecture_then_the_flag() {
    use bitnet_engine::gguf::ModelSource;
    use bitnet_engine::gguf::Value;
    use bitnet_engine::model::ActivationSource;
    let dir = tmp("activation");
    // tiny is ReLU²-gated: saved as TQ2_0 it is written under bitnet-25 (llama.cpp's `bitnet`
    // graph would run it with SiLU), with the activation under the key llama.cpp defines.
    let relu = bitnet_engine::Model::synthetic("tiny", WeightFormat::Tq2_0, 3, 2).unwrap();
    assert_eq!(relu.config.activation, FfnActivation::ReluSquared);
    let saved = dir.path().join("relu.gguf");
    bitnet_engine::gguf::save_model(&relu, WeightFormat::Tq2_0, &saved).unwrap();
    let bytes = std::fs::read(&saved).unwrap();
    let f = GgufFile::parse(&bytes).unwrap();
    assert_eq!(f.get("general.architecture").unwrap().as_str(), Some("bitnet-25"));
    assert_eq!(f.get("bitnet-25.hidden_activation").unwrap().as_str(), Some("relu2"));
    let m = load_model(&saved).unwrap();
    assert_eq!(m.config.activation, FfnActivation::ReluSquared);
    assert_eq!(m.config.activation_source, ActivationSource::MetadataKey("bitnet-25.hidden_activation".into()));
    // A SiLU model goes under llama.cpp's `bitnet`.
    let mut silu = relu.clone();
    silu.config.activation = FfnActivation::Silu;
    let saved_silu = dir.path().join("silu.gguf");
    bitnet_engine::gguf::save_model(&silu, WeightFormat::Tq1_0, &saved_silu).unwrap();
    let bytes = std::fs::read(&saved_silu).unwrap();
    assert_eq!(GgufFile::parse(&bytes).unwrap().get("general.architecture").unwrap().as_str(), Some("bitnet"));
    assert_eq!(load_model(&saved_silu).unwrap().config.activation, FfnActivation::Silu);

    // Without a key, the architecture decides, as llama.cpp's table does.
    for (arch, want) in [
        ("bitnet", FfnActivation::Silu),
        ("bitnet-b1.58", FfnActivation::ReluSquared),
        ("bitnet-25", FfnActivation::ReluSquared),
    ] {
        let out = dir.path().join(format!("{arch}.gguf"));
        with_metadata(&saved, &out, |meta| {
            meta.retain(|(k, _)| !k.ends_with(".hidden_activation"));
            rename_arch(meta, "bitnet-25", arch);
        });
        let m = load_model(&out).unwrap();
        assert_eq!(m.config.activation, want, "{arch}");
        assert_eq!(m.config.activation_source, ActivationSource::Architecture(arch.into()), "{arch}");
        assert_eq!(m.config.activation_source.to_string(), format!("architecture {arch}"));
        // --ffn-activation overrides both, and says so.
        let other = if want == FfnActivation::Silu { FfnActivation::ReluSquared } else { FfnActivation::Silu };
        let src = ModelSource::parse(out.to_str().unwrap()).unwrap();
        let (m, _) = src.load(WeightFormat::I2, 0, 1, Some(other)).unwrap();
        assert_eq!((m.config.activation, m.config.activation_source), (other, ActivationSource::Flag));
    }
    // A key naming the activation wins over the architecture: llama.cpp's SiLU names
    // under `bitnet-b1.58` give SiLU; files written before that key still load by the old one.
    for (key, value, want) in [
        ("bitnet-b1.58.hidden_activation", "swiglu", FfnActivation::Silu),
        ("bitnet-b1.58.hidden_activation", "silu", FfnActivation::Silu),
        ("bitnet_perf.ffn_activation", "silu", FfnActivation::Silu),
    ] {
        let out = dir.path().join("key.gguf");
        with_metadata(&saved, &out, |meta| {
            meta.retain(|(k, _)| !k.ends_with(".hidden_activation"));
            rename_arch(meta, "bitnet-25", "bitnet-b1.58");
            meta.push((key.into(), Value::String(value.into())));
        });
        let m = load_model(&out).unwrap();
        assert_eq!(m.config.activation, want, "{key} = {value}");
        assert_eq!(m.config.activation_source, ActivationSource::MetadataKey(key.into()));
    }
    // An activation this engine cannot run is refused by key and value.
    let out = dir.path().join("gelu.gguf");
    with_metadata(&saved, &out, |meta| {
        for (k, v) in meta.iter_mut() {
            if k == "bitnet-25.hidden_activation" {
                *v = Value::String("gelu".into());
            }
        }
    });
    let e = load_model(&out).unwrap_err().to_string();
    assert!(e.contains("bitnet-25.hidden_activation") && e.contains("gelu") && e.contains("relu2"), "{e}");
    // A preset says where its activation comes from too.
    let (p, _) = ModelSource::parse("tiny").unwrap().load(WeightFormat::I2, 1, 1, None).unwrap();
    assert_eq!(p.config.activation_source, ActivationSource::Preset);
}

/// The official 2B4T layout: `bitnet-b1.58`, I2_S linear weights, F16 tied embedding, F32
/// norms and sub-norms, hyperparameters under `bitnet-b1.58.*`; written by `save_model` in
/// format i2 and read back as the ReLU²-gated graph with the same ternary values.
#[test]
fn i2_s_files_in_the_official_layout_load_as_the_2b4t_graph() {
    let dir = tmp("i2s");
    let model = bitnet_engine::Model::synthetic("tiny", WeightFormat::I2, 6, 2).unwrap();
    let path = dir.path().join("official.gguf");
    bitnet_engine::gguf::save_model(&model, WeightFormat::I2, &path).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    let f = GgufFile::parse(&bytes).unwrap();
    assert_eq!(f.get("general.architecture").unwrap().as_str(), Some("bitnet-b1.58"));
    assert_eq!(f.get("bitnet-b1.58.block_count").unwrap().as_u64(), Some(2));
    assert_eq!(f.tensor("token_embd.weight").unwrap().ggml_type.name(), "F16");
    assert!(f.tensor("output.weight").is_none(), "tied head");
    assert_eq!(f.tensor("blk.0.ffn_sub_norm.weight").unwrap().ggml_type.name(), "F32");
    let q = f.tensor("blk.1.attn_q.weight").unwrap();
    assert_eq!((q.ggml_type.name(), q.size), ("I2_S", 256 * 256 / 4 + 32));
    // Without the activation key, the architecture alone makes it ReLU²-gated.
    let bare = dir.path().join("bare.gguf");
    with_metadata(&path, &bare, |meta| meta.retain(|(k, _)| !k.ends_with(".hidden_activation")));
    let loaded = load_model(&bare).unwrap();
    assert_eq!((loaded.config.activation, loaded.config.tied_embeddings), (FfnActivation::ReluSquared, true));
    for (a, b) in model.weights.layers.iter().zip(&loaded.weights.layers) {
        for (x, y) in a.linears().iter().zip(b.linears()) {
            let (x, y) = (x.unpack(), y.unpack());
            assert_eq!((x.values, x.scale), (y.values, y.scale));
        }
    }
}

#[test]
fn duplicate_tensor_names_and_keys_are_refused_by_name() {
    let dir = tmp("dup");
    let bytes = read("tiny-bitnet.gguf");
    let f = GgufFile::parse(&bytes).unwrap();
    let mut tensors = raw_tensors(&f);
    let copy = tensors.iter().position(|t| t.name == "blk.1.ffn_norm.weight").unwrap();
    let mut dup = tensors.remove(copy);
    dup.name = "blk.0.ffn_norm.weight".into();
    tensors.push(dup);
    let path = dir.path().join("dup.gguf");
    bitnet_engine::gguf::writer::write_raw(&path, &f.metadata, &tensors).unwrap();
    let e = load_model(&path).unwrap_err().to_string();
    assert!(e.contains("blk.0.ffn_norm.weight") && e.contains("more than once") && e.contains("dup.gguf"), "{e}");
    let mut meta = f.metadata.clone();
    meta.push(("bitnet.block_count".into(), bitnet_engine::gguf::Value::U32(2)));
    bitnet_engine::gguf::writer::write_raw(&path, &meta, &raw_tensors(&f)).unwrap();
    let e = load_model(&path).unwrap_err().to_string();
    assert!(e.contains("'bitnet.block_count'") && e.contains("more than once"), "{e}");
}

/// bitnet.cpp's multi-threaded I2_S quantization: each chunk of 16384 weights (whole rows) is
/// written with its own 32-byte scale, so the tensor spans `n/4 + 32 × chunks` bytes. Such a
/// file is refused by tensor, with the way to requantize; a healthy one of the same shapes
/// loads.
#[test]
fn i2_s_tensors_damaged_by_multithreaded_quantization_are_named() {
    let dir = tmp("damaged");
    let model = bitnet_engine::Model::synthetic("tiny", WeightFormat::I2, 6, 2).unwrap();
    let path = dir.path().join("healthy.gguf");
    bitnet_engine::gguf::save_model(&model, WeightFormat::I2, &path).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    let f = GgufFile::parse(&bytes).unwrap();
    for victim in ["blk.0.ffn_up.weight", "blk.1.ffn_down.weight"] {
        let mut tensors = raw_tensors(&f);
        let t = tensors.iter_mut().find(|t| t.name == victim).unwrap();
        let (cols, rows) = (t.dims[0] as usize, t.dims[1] as usize);
        let rows_per_chunk = 16384usize.div_ceil(cols);
        let chunks = rows.div_ceil(rows_per_chunk);
        assert!(chunks >= 2);
        // What the quantizer leaves: every chunk's codes and scale, back to back.
        let mut data = Vec::new();
        for c in 0..chunks {
            let n = (rows - c * rows_per_chunk).min(rows_per_chunk) * cols;
            data.extend(std::iter::repeat_n(0x55u8, n / 4));
            data.extend(0.5f32.to_le_bytes());
            data.extend([0u8; 28]);
        }
        t.data = data;
        let out = dir.path().join("damaged.gguf");
        bitnet_engine::gguf::writer::write_raw(&out, &f.metadata, &tensors).unwrap();
        let e = load_model(&out).unwrap_err().to_string();
        assert!(
            e.contains(victim) && e.contains("damaged") && e.contains("more than one thread") && e.contains("I2_S 1"),
            "{victim}: {e}"
        );
        assert!(e.contains(&format!("{chunks} chunks")), "{e}");
    }
    load_model(&path).unwrap();
}
