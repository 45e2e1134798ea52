"""The tiny Nemotron-H Omni layout (`tiny-random-nemotron-omni`) and the processor every Nemotron-H Omni model
here is served with (the tiny one and `random:nvidia/Nemotron-3-Nano-Omni-...`).

transformers 5.24's `nemotron_h_omni`: a RADIO vision tower that takes two frames per tubelet (stacked along
the channels) and attends within each tubelet alone, a pixel shuffle and MLP projector, a Parakeet audio
encoder, and a NemotronH language model whose layers are each one of Mamba-2 ("linear_attention"), attention
without rotary positions ("full_attention"), a mixture of experts ("moe") or a plain MLP ("mlp").
"""

from transformers import (
    NemotronH_Omni_Reasoning_V3,
    NemotronH_Omni_Reasoning_V3_Config,
    NemotronH_Omni_Reasoning_V3ImageProcessor,
    NemotronH_Omni_Reasoning_V3Processor,
    NemotronH_Omni_Reasoning_V3VideoProcessor,
    ParakeetFeatureExtractor,
)

# The media markers of the Nemotron-H Omni tokenizer, as its processor writes them: each tubelet (and image)
# is `<img>` + one `<image>` per token + `</img>`; audio is `<so_start>` + `<so_embedding>`s + `<so_end>`;
# `<video>` is the placeholder the processor expands into the tubelets.
MEDIA_TOKENS = ("<image>", "<img>", "</img>", "<video>", "<so_embedding>", "<so_start>", "<so_end>")

# Layer pattern of the tiny language model: Mamba-2, MoE, attention, Mamba-2, MLP. A Mamba layer before and
# after the attention layer, so a wrong recurrent state reaches the logits through both paths.
_LAYERS = ["linear_attention", "moe", "full_attention", "linear_attention", "mlp"]
# The real checkpoints' image normalisation (CLIP's); the tiny model reuses it so its pixels look alike.
_CLIP_MEAN, _CLIP_STD = [0.48145466, 0.4578275, 0.40821073], [0.26862954, 0.26130258, 0.27577711]
# The rate the released checkpoints' config.json sets (`video_pruning_rate`), so the tiny model exercises the
# default it gives the server.
_CHECKPOINT_PRUNING_RATE = 0.7


def media_token_ids(tokenizer) -> dict[str, int]:
    """The config fields that name the media tokens, as ids of `tokenizer`. Video tubelets use the image
    token (`<image>`); `video_token_id` names the `<video>` placeholder, which never reaches the model."""
    ids = dict(zip(MEDIA_TOKENS, tokenizer.convert_tokens_to_ids(list(MEDIA_TOKENS))))
    return {"image_token_id": ids["<image>"], "video_token_id": ids["<video>"], "audio_token_id": ids["<so_embedding>"]}


def omni_processor(tokenizer, video_settings: dict, image_settings: dict, audio_settings: dict):
    """The Nemotron-H Omni processor around `tokenizer`, with the given processor settings (the keyword
    arguments of its video processor, image processor and Parakeet feature extractor)."""
    return NemotronH_Omni_Reasoning_V3Processor(
        image_processor=NemotronH_Omni_Reasoning_V3ImageProcessor(**image_settings),
        video_processor=NemotronH_Omni_Reasoning_V3VideoProcessor(**video_settings),
        feature_extractor=ParakeetFeatureExtractor(**audio_settings),
        tokenizer=tokenizer,
    )


def nemotron_omni_layout(tokenizer, name: str, init_range: float):
    """(model class, config, processor) of the tiny Nemotron-H Omni: float32-sized for tests, a hybrid
    language model of 5 layers (2 Mamba-2, 1 attention, 1 MoE, 1 MLP), a 2-layer RADIO tower, a 1-layer
    Parakeet encoder; init_range is the text weights' std."""
    config = NemotronH_Omni_Reasoning_V3_Config(
        text_config=dict(
            vocab_size=len(tokenizer),
            hidden_size=64,
            layers_block_type=_LAYERS,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            intermediate_size=128,
            mamba_num_heads=4,
            mamba_head_dim=16,
            ssm_state_size=16,
            n_groups=2,
            conv_kernel=4,
            # Chunks of 32 tokens: a prompt spans several, so the chunked scan's carry between them is tested.
            chunk_size=32,
            n_routed_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            moe_shared_expert_intermediate_size=32,
            max_position_embeddings=32768,
            initializer_range=init_range,
            pad_token_id=tokenizer.pad_token_id,
            bos_token_id=None,
            eos_token_id=tokenizer.eos_token_id,
        ),
        vision_config=dict(
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            max_img_size=512,
            num_cls_tokens=2,
            num_registers=2,
            video_temporal_patch_size=2,
            norm_mean=_CLIP_MEAN,
            norm_std=_CLIP_STD,
        ),
        audio_config=dict(
            hidden_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            intermediate_size=64,
            subsampling_conv_channels=8,
            num_mel_bins=16,
            projection_hidden_size=32,
            projection_bias=False,
        ),
        vision_hidden_size=32,
        projector_hidden_size=64,
        video_pruning_rate=_CHECKPOINT_PRUNING_RATE,
        **media_token_ids(tokenizer),
    )
    image = dict(norm_mean=_CLIP_MEAN, norm_std=_CLIP_STD, patch_size=16, downsample_ratio=0.5)
    processor = omni_processor(
        tokenizer,
        video_settings={**image, "video_target_num_patches": 256},
        image_settings=image,
        audio_settings={"feature_size": 16},
    )
    return NemotronH_Omni_Reasoning_V3, config, processor
