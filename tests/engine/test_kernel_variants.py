"""One build serves every CPU: the kernels are compiled in every variant an image ships, each variant this CPU can
run is checked against the references (the kernel tests loop over kernel_builds()), and the engine loads the best
variant the CPU reports, never one whose instructions it lacks."""

from __future__ import annotations

import pytest
from engine_fixtures import kernel_builds

from backends.engine.kernels import build, variants
from backends.engine.kernels.variants import X86_VARIANTS, Variant, best, runs_here

V3_FLAGS = frozenset({"sse2", "avx", "avx2", "fma", "bmi1", "bmi2", "f16c", "movbe", "abm"})  # an AVX2-only EPYC
V4_FLAGS = V3_FLAGS | {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"}


@pytest.mark.parametrize("variant", variants.variants(), ids=lambda v: v.name)
def test_every_variant_this_cpu_runs_is_built_and_checked(variant: Variant):
    """Each variant of this architecture: built and among the libraries the kernel tests check, or, where this CPU
    lacks its instructions, skipped by name (never counted as passing)."""
    if not runs_here(variant):
        missing = sorted(variant.needs - variants.cpu_flags())
        pytest.skip(f"{variant.name}: this CPU lacks {', '.join(missing)}")
    assert variant.name in kernel_builds()


def test_the_best_variant_the_cpu_runs_is_chosen():
    """By the CPU's flags: AMX tiles (with VNNI and AVX-512 BF16), AVX-512 with VNNI, AVX-512, AVX2 with AVX-VNNI,
    AVX2 or the baseline, whichever is the best it has; a variant the directory lacks is passed over; with no flags
    known, only the baseline."""
    names = [variant.name for variant in X86_VARIANTS]
    amx = V4_FLAGS | {"avx512_vnni", "avx512_bf16", "amx_tile", "amx_bf16"}
    assert best(names, amx).name == "x86-64-v4-amx"
    assert best(names, amx - {"amx_bf16"}).name == "x86-64-v4-vnni"
    assert best(names, V4_FLAGS | {"avx512_vnni"}).name == "x86-64-v4-vnni"
    assert best(names, V4_FLAGS).name == "x86-64-v4"
    assert best(names, V3_FLAGS | {"avx_vnni"}).name == "x86-64-v3-vnni"  # an E-core Xeon
    assert best(names, V4_FLAGS | {"avx_vnni"}).name == "x86-64-v4"
    assert best(names, V3_FLAGS).name == "x86-64-v3"
    assert best(names, V3_FLAGS - {"fma"}).name == "x86-64"
    assert best(names, frozenset()).name == "x86-64"
    assert best(["x86-64-v3", "x86-64"], V4_FLAGS).name == "x86-64-v3"
    assert best(["x86-64-v4"], V3_FLAGS) is None


@pytest.mark.skipif(not variants.is_x86(), reason="the x86-64 variants are built on x86-64 machines")
def test_the_engine_loads_the_best_variant_of_a_directory_of_variants(monkeypatch, tmp_path):
    """`build-kernels --variants` writes every variant and its index; with GATEWAY_ENGINE_KERNELS naming that
    directory, the library chosen is the best this CPU runs (what /readyz reports as cpu_kernels), and on a CPU
    with AVX2 alone, the AVX2 one, never an AVX-512 build."""
    built = build.build_variants(tmp_path / "kernels", cuda=False)
    assert {path.parent.name for path in built} == {variant.name for variant in X86_VARIANTS}
    monkeypatch.setenv(build.KERNELS_ENV, str(tmp_path / "kernels"))
    build.kernel_choice.cache_clear()
    try:
        choice = build.kernel_choice()
        here = variants.level()
        assert choice is not None and choice.variant == here and choice.path.parent.name == here
        monkeypatch.setattr(variants, "cpu_flags", lambda: V3_FLAGS)
        build.kernel_choice.cache_clear()
        choice = build.kernel_choice()
        assert choice is not None and choice.variant == "x86-64-v3"
        assert choice.path == tmp_path / "kernels" / "x86-64-v3" / build.LIBRARY
        monkeypatch.setenv(build.KERNELS_ENV, str(tmp_path / "kernels" / "x86-64-v4-vnni" / build.LIBRARY))
        build.kernel_choice.cache_clear()  # one library named: its variant read from the build.json beside it
        assert (build.kernel_choice().variant, build.kernel_choice().level) == ("x86-64-v4-vnni", "x86-64-v4-vnni")
    finally:
        build.kernel_choice.cache_clear()
