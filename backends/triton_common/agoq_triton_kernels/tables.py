"""Plain-data tables of the numerics contract (no triton import): NF4 levels and thresholds.

Exact fp32 values (as Python floats): the NF4 levels bitsandbytes uses and the decision thresholds
fp32((L[i] + L[i+1]) * 0.5) exactly as agoq_core.formats.reference.nf4_thresholds() computes them. The
@triton.jit helpers in codes.py spell the same numbers as constexprs; a test checks all three agree.
"""
from __future__ import annotations

__all__ = ["NF4_LEVELS", "NF4_THRESHOLDS"]

NF4_LEVELS = (-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
              -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
              0.07958029955625534, 0.16093020141124725, 0.24611230194568634, 0.33791524171829224,
              0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0)
NF4_THRESHOLDS = (-0.8480963706970215, -0.6106328964233398, -0.4599952697753906,
                  -0.33967941999435425, -0.23460739850997925, -0.13791173696517944,
                  -0.045525018125772476, 0.03979014977812767, 0.120255246758461,
                  0.2035212516784668, 0.2920137643814087, 0.3893125355243683,
                  0.5016634464263916, 0.6427869200706482, 0.8614784479141235)
