"""A plain, independent SeedVR2 VAE written from the spec (shared/specs/seedvr2_vae.md), for tests only.

Deliberately naive and whole-clip: einops rearranges, head padding by concatenating copies of frame 0,
always 3-D convs, F.group_norm on (b t) c h w, explicit fp32 softmax attention, no fast paths and no
shared code with turbovae.vae.seedvr2 — it reads weights from the state dict by key name.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from einops import rearrange

EPS = 1e-6


class ReferenceSeedVR2:
    def __init__(self, sd: dict[str, torch.Tensor], groups: int, blocks: int = 4, layers: int = 2):
        self.sd = {k: v.float() for k, v in sd.items()}
        self.groups = groups
        self.blocks = blocks
        self.layers = layers

    # -- primitives -------------------------------------------------------------------------------
    def causal_conv(self, name: str, x: torch.Tensor, stride=(1, 1, 1), t_pad: int = 1, hw_pad: int = 1):
        w, b = self.sd[name + ".weight"], self.sd[name + ".bias"]
        if t_pad:
            x = torch.cat([x[:, :, :1]] * (2 * t_pad) + [x], dim=2)
        return F.conv3d(x, w, b, stride=stride, padding=(0, hw_pad, hw_pad))

    def norm(self, name: str, x: torch.Tensor, silu: bool = True):
        t = x.shape[2]
        y = rearrange(x, "b c t h w -> (b t) c h w")
        y = F.group_norm(y, self.groups, self.sd[name + ".weight"], self.sd[name + ".bias"], EPS)
        y = rearrange(y, "(b t) c h w -> b c t h w", t=t)
        return F.silu(y) if silu else y

    def resnet(self, name: str, x: torch.Tensor):
        h = self.causal_conv(name + ".conv1", self.norm(name + ".norm1", x))
        h = self.causal_conv(name + ".conv2", self.norm(name + ".norm2", h))
        if name + ".conv_shortcut.weight" in self.sd:
            x = self.causal_conv(name + ".conv_shortcut", x, t_pad=0, hw_pad=0)
        return x + h

    def attention(self, name: str, x: torch.Tensor):
        b, c, t, h, w = x.shape
        frames = rearrange(x, "b c t h w -> (b t) c h w")
        y = F.group_norm(frames, self.groups, self.sd[name + ".group_norm.weight"], self.sd[name + ".group_norm.bias"], EPS)
        tok = rearrange(y, "n c h w -> n (h w) c")
        lin = lambda k, v: F.linear(v, self.sd[f"{name}.{k}.weight"], self.sd[f"{name}.{k}.bias"])
        q, k, v = lin("to_q", tok), lin("to_k", tok), lin("to_v", tok)
        attn = torch.softmax((q @ k.transpose(1, 2)).float() / c ** 0.5, dim=-1)
        o = lin("to_out.0", attn @ v)
        o = rearrange(o, "n (h w) c -> n c h w", h=h) + frames
        return rearrange(o, "(b t) c h w -> b c t h w", t=t)

    def mid(self, name: str, x: torch.Tensor):
        x = self.resnet(name + ".resnets.0", x)
        x = self.attention(name + ".attentions.0", x)
        return self.resnet(name + ".resnets.1", x)

    # -- encoder / decoder ------------------------------------------------------------------------
    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """Pixels [B,3,T,H,W] -> moments [B,32,T',H/8,W/8]."""
        x = self.causal_conv("encoder.conv_in", x.float())
        for i in range(self.blocks):
            for j in range(self.layers):
                x = self.resnet(f"encoder.down_blocks.{i}.resnets.{j}", x)
            if i < self.blocks - 1:
                x = F.pad(x, (0, 1, 0, 1))
                temporal = i >= self.blocks - 3
                x = self.causal_conv(f"encoder.down_blocks.{i}.downsamplers.0.conv", x,
                                     stride=(2 if temporal else 1, 2, 2), t_pad=1 if temporal else 0, hw_pad=0)
        x = self.mid("encoder.mid_block", x)
        return self.causal_conv("encoder.conv_out", self.norm("encoder.conv_norm_out", x))

    def decode(self, z: torch.Tensor) -> torch.Tensor:
        """Latents [B,16,n,h,w] -> pixels [B,3,1+4(n-1),8h,8w] (not clamped)."""
        x = self.mid("decoder.mid_block", self.causal_conv("decoder.conv_in", z.float()))
        for i in range(self.blocks):
            for j in range(self.layers + 1):
                x = self.resnet(f"decoder.up_blocks.{i}.resnets.{j}", x)
            if i < self.blocks - 1:
                temporal = i < 2
                name = f"decoder.up_blocks.{i}.upsamplers.0"
                x = F.conv3d(x, self.sd[name + ".upscale_conv.weight"], self.sd[name + ".upscale_conv.bias"])
                x = rearrange(x, "b (x y z c) f h w -> b c (f z) (h x) (w y)", x=2, y=2, z=2 if temporal else 1)
                if temporal:  # drop the duplicated copy of frame 0
                    x = torch.cat([x[:, :, :1], x[:, :, 2:]], dim=2)
                x = self.causal_conv(name + ".conv", x)
        return self.causal_conv("decoder.conv_out", self.norm("decoder.conv_norm_out", x))


def random_state_dict(shapes: dict[str, tuple[int, ...]], seed: int = 0) -> dict[str, torch.Tensor]:
    """Seeded weights with fan-in scaling so activations stay O(1) through the whole network."""
    g = torch.Generator().manual_seed(seed)
    sd = {}
    for k, shape in sorted(shapes.items()):
        if k.endswith(".bias"):
            sd[k] = 0.02 * torch.randn(shape, generator=g)
        elif len(shape) == 1:  # norm scale
            sd[k] = 1.0 + 0.1 * torch.randn(shape, generator=g)
        else:
            fan_in = 1
            for d in shape[1:]:
                fan_in *= d
            sd[k] = torch.randn(shape, generator=g) / fan_in ** 0.5
    return sd
