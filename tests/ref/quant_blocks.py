"""Random valid blocks of the GGUF formats the `gguf` package cannot quantize (the K-quants,
IQ4_NL, IQ4_XS): random bytes, then each block's f16 scales set to values that keep the weights
small. The values they stand for come from gguf.quants.dequantize, so a test knows them exactly."""
import numpy as np

import gguf
from gguf import GGMLQuantizationType as QT

# (byte offset of an f16 scale in the block, low, high)
RANDOM_BLOCK_SCALES = {
    QT.Q2_K: [(80, 0.0005, 0.003), (82, 0.0005, 0.003)],      # d, dmin
    QT.Q3_K: [(108, 0.0005, 0.003)],                          # d
    QT.Q4_K: [(0, 0.0005, 0.003), (2, 0.0005, 0.003)],        # d, dmin
    QT.Q5_K: [(0, 0.0003, 0.002), (2, 0.0005, 0.003)],        # d, dmin
    QT.Q6_K: [(208, 0.00005, 0.0003)],                        # d
    QT.IQ4_NL: [(0, 0.0002, 0.002)],                          # d
    QT.IQ4_XS: [(0, 0.00002, 0.0002)],                        # d
}


def random_blocks(qt, rows, K, rng):
    """[rows, K / block * block bytes] uint8: rows of random valid qt blocks."""
    block, size = gguf.GGML_QUANT_SIZES[qt]
    nb = K // block
    b = rng.integers(0, 256, size=(rows, nb, size), dtype=np.uint8)
    for off, lo, hi in RANDOM_BLOCK_SCALES[qt]:
        d = rng.uniform(lo, hi, size=(rows, nb, 1)).astype(np.float16)
        b[:, :, off:off + 2] = d.view(np.uint8).reshape(rows, nb, 2)
    return b.reshape(rows, nb * size)
