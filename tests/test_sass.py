"""`scratchops sass` (no GPU needed): the SASS of one kernel file, counted per kernel, shows
each GEMM version's arithmetic where the progression puts it."""

import pytest

from scratchops._build import cuda_dir
from scratchops.tools import cli, sass, sass_hazards

pytestmark = pytest.mark.skipif(sass.why_unavailable() is not None,
                                reason=f"cannot read SASS here: {sass.why_unavailable()}")


def test_gemm_versions_use_the_units_their_idea_names():
    rows = {r["kernel"]: r for r in sass.instruction_mix(cuda_dir() / "gemm.cu", "90a")}
    assert rows["gemm_naive_kernel"]["FFMA"] > 0
    assert rows["gemm_pipelined_kernel"]["FFMA"] >= 512  # 8x8 patch, unrolled over k-steps
    wgmma = [r for name, r in rows.items() if name.startswith("tf32x3_kernel<")]
    mma_sync = [r for name, r in rows.items() if name.startswith("mma_sync_kernel<")]
    assert wgmma and all(r["HGMMA"] > 0 and r["FFMA"] == 0 for r in wgmma)
    assert mma_sync and all(r["HMMA"] > 0 and r["HGMMA"] == 0 for r in mma_sync)
    # 3xTF32 issues three products for each of the one-product TF32 mode.
    assert sorted(r["HMMA"] for r in mma_sync) == [64, 192]


@pytest.mark.parametrize("name", ["conv_implicit.cu", "conv_backward.cu"])
def test_the_implicit_gemm_convolutions_keep_their_wgmma_pipelines(name):
    """Every kernel of the implicit-GEMM files (the ring engine's modes, the resident-B kernel,
    the weight gradient's loader) issues each wgmma while the one before runs: ptxas
    serialises none of them."""
    assert sass.serialised_wgmma(cuda_dir() / name) == []


@pytest.mark.parametrize("name", ["conv_implicit.cu", "conv_gn_pool.cu", "gemm.cu",
                                  "conv_backward.cu"])
def test_no_instruction_writes_into_a_running_wgmma(name):
    assert sass_hazards.wgmma_register_hazards(cuda_dir() / name) == {}


@pytest.mark.parametrize("name", ["conv_implicit.cu", "conv_gn_pool.cu", "gemm.cu",
                                  "conv_backward.cu", "conv_gn_pool_backward.cu"])
def test_every_memory_descriptor_is_a_register_pair(name):
    """The copies and loads with an L2 cache policy (the P85 files' 4-byte cp.async among
    them) name their descriptors as pairs of uniform registers."""
    assert sass_hazards.odd_descriptor_instructions(cuda_dir() / name) == {}


def test_the_descriptor_reader_finds_the_copy_that_stopped_the_gpu():
    """The LDGSTS ptxas produced once for a 4-byte cp.async with an L2 cache hint (an
    illegal instruction on the GPU), beside the form the working kernels have."""
    (instructions,) = sass_hazards._kernels("\n".join([
        "        Function : k",
        "        /*fb00*/                   LDGSTS.E [R13+UR0], desc[UR1][R2.64], P5 ;",
        "        /*fb10*/                   LDGSTS.E [R5+0x27fc0], desc[UR4][R2.64], !P1 ;",
        "        /*fb20*/                   EXIT ;"])).values()
    (found,) = sass_hazards.odd_descriptors(instructions)
    assert found.startswith("fb00 LDGSTS.E") and "desc[UR1]" in found


def test_the_hazard_reader_finds_a_write_at_a_loops_head():
    """The pattern ptxas produced once: the loop's last wgmma still running when a copy at
    the loop's head writes its A registers; a full wait before the back edge removes it."""
    def kernel(wait_before_back_edge):
        return "\n".join([
            "        Function : k",
            "        /*0000*/                   MOV R88, R93 ;",
            "        /*0010*/                   HGMMA.64x128x16.F32.BF16 R24, R88, gdesc[UR8], R24, gsb0 ;",
            "        /*0020*/                   WARPGROUP.DEPBAR.LE gsb0, 0x1 ;",
            f"        /*0030*/                   WARPGROUP.DEPBAR.LE gsb0, 0x{0 if wait_before_back_edge else 1} ;",
            "        /*0040*/               @!P4 BRA 0x0 ;",
            "        /*0050*/                   EXIT ;"])

    for wait, expected in [(False, 1), (True, 0)]:
        (instructions,) = sass_hazards._kernels(kernel(wait)).values()
        found = sass_hazards.hazards(instructions)
        assert len(found) == expected and all("MOV R88" in f for f in found), found


def test_the_command_prints_one_row_per_kernel(capsys):
    assert cli.main(["sass", "pool_clamp.cu", "--arch", "80", "--kernel", "pool"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "pool_clamp.cu for sm_80: SASS instructions per kernel"
    assert lines[1].split()[:3] == ["kernel", "FFMA", "FMUL/FADD"]
    assert len(lines) > 2 and all("pool" in line.split()[0] for line in lines[2:])


def test_readable_names_keep_template_arguments():
    assert sass.readable_name("_ZN10scratchops2tc13pack_b_kernelILi128ENS_7gemm_v59RowMajorBEEEvT0_"
                              "PhNS0_7PackedBE") == "pack_b_kernel<128>"
    assert sass.readable_name("_Z6kernelPf") == "kernel"
    assert sass.readable_name("_ZN1a1kILb1ELi3EEEvv") == "k<true, 3>"


def test_an_unknown_file_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(["sass", "no_such_file.cu"])
    assert info.value.code == 2 and "no kernel file" in capsys.readouterr().err
