"""Instructions in a kernel's SASS that the hardware would run wrongly or refuse: writes into
the registers of a wgmma that may still be running, and memory descriptors that are no
register pair.

A wgmma (HGMMA in SASS) reads its A registers and reads and writes its accumulators while it
runs, until a `WARPGROUP.DEPBAR.LE gsb0, N` leaves at most N groups of wgmmas running (a group
ends at the HGMMA marked gsb0). An instruction that writes one of those registers before then
changes what the wgmma computes. ptxas is meant to prevent it (it serialises the wgmmas and
says so, warning C7513), but it has been seen to move a register copy above the wait across a
loop's back edge, silently (docs/notes.md, "B resident"). This reads the SASS the way the
hardware runs it: straight-line code in order, and each loop (a backward branch) twice, so
that the wgmmas still running when the loop comes round meet the loop's head.
"""

import functools
import re
import tempfile
from pathlib import Path

_FUNCTION = re.compile(r"\s*Function : (\S+)")
_INSTRUCTION = re.compile(r"\s*/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Za-z0-9_.]*)\s*([^;]*);")
_HGMMA = re.compile(r"HGMMA\.64x(\d+)x\d+")
_REGISTER = re.compile(r"\bR(\d+)\b")
# Opcodes that write no general register in their first operand.
_NO_DESTINATION = ("ST", "BRA", "BAR", "SYNCS", "WARPSYNC", "WARPGROUP", "RED", "ATOM", "EXIT",
                   "BSSY", "BSYNC", "CALL", "RET", "NOP", "MEMBAR", "FENCE", "ERRBAR", "CCTL",
                   "UTMA", "ARRIVES", "DEPBAR", "ISETP", "FSETP", "DSETP", "HSETP", "PLOP3",
                   "R2UR", "VOTEU", "UISETP", "ULDC", "UMOV", "UIADD3", "ULOP3", "USHF", "UIMAD",
                   "USEL", "UPRMT", "ULEA", "UFLO", "UPOPC", "UBMSK", "USGXT", "UBREV", "S2UR",
                   "REDUX", "ELECT", "ACQBULK", "UBLKCP", "UCGABAR")


def _kernels(sass: str) -> dict[str, list[tuple[int, str, str]]]:
    """Per kernel: its instructions as (address, opcode, operands), in order."""
    kernels: dict[str, list[tuple[int, str, str]]] = {}
    current = None
    for line in sass.splitlines():
        function = _FUNCTION.match(line)
        if function:
            current = kernels.setdefault(function.group(1), [])
            continue
        instruction = _INSTRUCTION.match(line)
        if instruction and current is not None:
            current.append((int(instruction.group(1), 16), instruction.group(3),
                            instruction.group(4)))
    return kernels


def _written(opcode: str, operands: str) -> set[int]:
    """The general registers an instruction writes (its first operand; two for 64-bit)."""
    if opcode.startswith(_NO_DESTINATION) or opcode.startswith("HGMMA"):
        return set()
    first = _REGISTER.match(operands.strip())
    if first is None:
        return set()
    base = int(first.group(1))
    wide = ".64" in opcode or "WIDE" in opcode or opcode.startswith(("LDG.E.64", "LDS.64"))
    quad = ".128" in opcode
    return set(range(base, base + (4 if quad else 2 if wide else 1)))


def hazards(instructions: list[tuple[int, str, str]]) -> list[str]:
    """Each instruction that writes a register of a wgmma that may be running, with it."""
    at = {address: i for i, (address, _, _) in enumerate(instructions)}
    found: set[tuple[int, int]] = set()

    def run(first: int, last: int, groups: list, record: bool) -> list:
        pending: list = []  # the wgmmas of the group not yet closed
        for i in range(first, last + 1):
            _, opcode, operands = instructions[i]
            if opcode.startswith("WARPGROUP.DEPBAR"):
                keep = int(re.search(r"0x([0-9a-f]+)", operands).group(1), 16)
                groups = groups[-keep:] if keep else []
                continue
            hgmma = _HGMMA.match(opcode)
            if hgmma:
                registers = [int(r) for r in _REGISTER.findall(operands)]
                accumulators = set(range(registers[0], registers[0] + int(hgmma.group(1)) // 2))
                # A in registers (its second operand a register, not a descriptor): four.
                in_registers = operands.split(",")[1].strip().startswith("R")
                a = set(range(registers[1], registers[1] + 4)) if in_registers else set()
                pending.append((i, accumulators | a))
                if "gsb0" in operands:
                    groups = groups + [pending]
                    pending = []
                continue
            written = _written(opcode, operands)
            if record and written:
                for group in groups + [pending]:
                    for j, registers in group:
                        if written & registers:
                            found.add((i, j))
        return groups

    groups: list = []
    i = 0
    while i < len(instructions):
        _, opcode, operands = instructions[i]
        target = re.search(r"BRA\S*\s+(0x[0-9a-f]+)", f"{opcode} {operands}")
        loop_head = at.get(int(target.group(1), 16)) if target else None
        if loop_head is not None and loop_head < i:  # a loop: its body once more, recorded
            groups = run(loop_head, i, groups, True)
        groups = run(i, i, groups, True)
        i += 1
    return [f"{instructions[i][0]:04x} {instructions[i][1]} {instructions[i][2]} writes into "
            f"the wgmma at {instructions[j][0]:04x}" for i, j in sorted(found)]


# A global memory access's descriptor (desc[URn]: its cache policy among others) is a 64-bit
# pair of uniform registers, so n is even. ptxas has emitted a 4-byte cp.async that carries an
# L2 cache hint as an LDGSTS whose descriptor is UR1 and whose shared address adds UR0, neither
# written anywhere in the kernel; the GPU stops at it with "an illegal instruction"
# (docs/notes.md, "The weight gradient's dy split by the consumers").
_DESCRIPTOR = re.compile(r"desc\[UR(\d+)\]")


def odd_descriptors(instructions: list[tuple[int, str, str]]) -> list[str]:
    """Each instruction whose memory descriptor starts at an odd uniform register."""
    return [f"{address:04x} {opcode} {operands}" for address, opcode, operands in instructions
            if any(int(n) % 2 for n in _DESCRIPTOR.findall(operands))]


@functools.lru_cache(maxsize=None)
def _kernels_of(source: Path, arch: str) -> dict[str, list[tuple[int, str, str]]]:
    """The file's kernels as _kernels reads them (compiled once a session: each check reads
    the same SASS)."""
    from .sass import compile_cubin, disassemble

    with tempfile.TemporaryDirectory() as folder:
        return _kernels(disassemble(compile_cubin(source, arch, Path(folder))))


def _per_kernel(check, source: Path, arch: str) -> dict[str, list[str]]:
    found = {name: check(instructions) for name, instructions in _kernels_of(source, arch).items()}
    return {name: lines for name, lines in found.items() if lines}


def wgmma_register_hazards(source: Path, arch: str = "90a") -> dict[str, list[str]]:
    """Per kernel of the file (mangled name) that has any: its hazards (see hazards)."""
    return _per_kernel(hazards, source, arch)


def odd_descriptor_instructions(source: Path, arch: str = "90a") -> dict[str, list[str]]:
    """Per kernel of the file (mangled name) that has any: see odd_descriptors."""
    return _per_kernel(odd_descriptors, source, arch)
