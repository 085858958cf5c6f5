"""tests/gpu/prefetch_check.py on small SASS listings (no GPU): a loop load relocated by a copy
inside its own iteration is flagged; a copy that the same iteration reads on, a load first read
by arithmetic, and a copy after the loop are not. The listings follow cuobjdump's layout, with
the instructions of the k_t4_gemv case (session 49) cut down to what the check reads."""
import pathlib
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "gpu"))
import prefetch_check  # noqa: E402


def listing(name, body):
    lines = [f"\t\tFunction : {name}"]
    for i, ins in enumerate(body):
        lines.append(f"        /*{16 * i:04x}*/                   {ins} ;  /* 0x0 */")
    return "\n" + "\n".join(lines) + "\n"


LOOP_HEAD = ["MOV R1, c[0x0][0x28]", "S2R R0, SR_TID.X"]

# The refill of q[u] (R52..R55) moved into the loop-carried R80..R83 within the same step.
RELOCATED = LOOP_HEAD + [
    "@!P0 LDG.E.NA.128.CONSTANT R52, desc[UR6][R100.64+0x800]",
    "LOP3.LUT R13, R80, 0xf000f, RZ, 0xc0, !PT",
    "HMMA.16816.F32.BF16 R64, R64, R24, RZ",
    "IMAD.MOV.U32 R83, RZ, RZ, R55",
    "FFMA R5, R10, R60, R5",
    "@!P1 BRA 0x20",
    "EXIT",
]
# The copy feeds this iteration's arithmetic (a guarded load, as the decode attention has).
CONSUMED = LOOP_HEAD + [
    "@P1 LDG.E.128 R40, desc[UR10][R40.64]",
    "@P1 MOV R128, R40",
    "FFMA R5, R128, R60, R5",
    "@!P1 BRA 0x20",
    "EXIT",
]
# The load is first read by arithmetic; the copy after the loop is not inside it.
ARITHMETIC = LOOP_HEAD + [
    "LDG.E.NA.128.CONSTANT R52, desc[UR6][R100.64]",
    "LOP3.LUT R13, R52, 0xf000f, RZ, 0xc0, !PT",
    "@!P1 BRA 0x20",
    "MOV R83, R53",
    "EXIT",
]


def flagged(sass):
    return {name: hits for name, hits in prefetch_check.relocated_loads(sass)}


def test_relocated_refill_is_flagged():
    got = flagged(listing("k_bad", RELOCATED))
    assert got == {"k_bad": [("0020", "0050")]}


def test_consumed_copy_and_plain_use_are_not_flagged():
    assert flagged(listing("k_copy", CONSUMED) + listing("k_plain", ARITHMETIC)) == {}


def test_command_line_exit_status(tmp_path):
    bad, good = tmp_path / "bad.sass", tmp_path / "good.sass"
    bad.write_text(listing("k_bad", RELOCATED) + listing("k_plain", ARITHMETIC))
    good.write_text(listing("k_copy", CONSUMED))
    tool = [sys.executable, str(REPO / "tests" / "gpu" / "prefetch_check.py")]
    r = subprocess.run(tool + [str(bad)], capture_output=True, text=True)
    assert r.returncode == 1 and "k_bad" in r.stdout and "k_plain" not in r.stdout, r.stdout
    r = subprocess.run(tool + [str(good)], capture_output=True, text=True)
    assert r.returncode == 0 and "0 kernel(s)" in r.stdout, r.stdout
