"""Where a kernel's time goes, by the parts of its source: the ncu source view summed over
ranges of source lines (a phase of a kernel whose functions are inlined into one).

Make the view on the GPU machine from a report taken with --import-source yes:
    ncu --import fused.ncu-rep --page source --csv --print-source cuda,sass > view.csv
then, anywhere:
    python3 scripts/ncu_phases.py view.csv compute_y=conv_gn_pool_backward.cuh:22-73 ...
or, to find the ranges worth naming, each source file's share and the N lines that execute
the most instructions (helpers inlined from other files count where they are written):
    python3 scripts/ncu_phases.py view.csv --lines N
or each stall reason's share of the samples:
    python3 scripts/ncu_phases.py view.csv --stalls
Each SASS instruction counts toward the phase of its source line; one from a line outside
every range (a helper in another file, inlined) counts toward the phase of the instruction
before it in address order. The share of stall samples is the share of the kernel's time
spent there; wavefronts are shared-memory wavefronts ("ideal": without bank conflicts or
broadcast losses).
"""

import collections
import csv
import sys

COLUMNS = {"samples": "# Samples", "instructions": "Instructions Executed",
           "wavefronts": "L1 Wavefronts Shared", "ideal": "L1 Wavefronts Shared Ideal",
           "short_sb": "stall_short_sb", "barrier": "stall_barrier"}


def number(text: str) -> float:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return 0.0


def sass_rows(path: str):
    """(header, row, source file, source line) of each SASS instruction's row of the view."""
    header, file, line = None, None, None
    for row in csv.reader(open(path)):
        if not row:
            continue
        if row[0] == "File Path":
            file = row[1].rsplit("/", 1)[-1]
        elif row[0] == "Line No":
            header = row
        elif header and row[0] not in ("", "Function Name"):
            line = int(row[0])
        elif header and row[0] == "" and row[2].startswith("0x"):
            yield header, row, file, line


def instructions(path: str):
    """(address, source file, source line, {column: value}) of each SASS instruction."""
    for header, row, file, line in sass_rows(path):
        values = dict(zip(header[4:], row[4:]))
        yield int(row[2], 16), file, line, {k: number(values.get(c, "0"))
                                            for k, c in COLUMNS.items()}


def stalls(path: str) -> None:
    """Each stall reason's share of the kernel's stall samples (those of warps that issued
    nothing in the sampled cycle, ncu's '(Not Issued)' columns, left out: they repeat them)."""
    totals = collections.Counter()
    for header, row, _, _ in sass_rows(path):
        for column, text in zip(header[4:], row[4:]):
            if column.startswith("stall_") and "Not Issued" not in column:
                totals[column] += number(text)
    everything = max(sum(totals.values()), 1)
    for column, samples in totals.most_common():
        if samples:
            print(f"{column:28s}{samples:10.0f}{100 * samples / everything:8.1f}%")


def print_totals(totals: collections.Counter) -> None:
    print("totals: " + ", ".join(f"{k} {totals[k]:.0f}" for k in COLUMNS))


def main(path: str, specs: list[str]) -> None:
    phases = []  # (name, file, first line, last line)
    for spec in specs:
        name, where = spec.split("=")
        file, lines = where.rsplit(":", 1)
        first, last = (int(n) for n in lines.split("-"))
        phases.append((name, file, first, last))
    sums = collections.defaultdict(lambda: collections.Counter())
    current = "other"
    for _, file, line, values in sorted(instructions(path), key=lambda i: i[0]):
        current = next((name for name, f, first, last in phases
                        if f == file and first <= line <= last), current)
        sums[current].update(values)
    totals = collections.Counter()
    for counts in sums.values():
        totals.update(counts)
    print(f"{'phase':14s}" + "".join(f"{k:>14s}" for k in COLUMNS))
    for name, counts in sorted(sums.items(), key=lambda kv: -kv[1]["samples"]):
        print(f"{name:14s}" + "".join(f"{100 * counts[k] / max(totals[k], 1):13.1f}%"
                                      for k in COLUMNS))
    print_totals(totals)


def lines(path: str, count: int) -> None:
    by_line = collections.defaultdict(collections.Counter)
    for _, file, line, values in instructions(path):
        by_line[(file, line)].update(values)
    totals, by_file = collections.Counter(), collections.defaultdict(collections.Counter)
    for (file, _), counts in by_line.items():
        totals.update(counts)
        by_file[file].update(counts)

    def share(counts, key):
        return 100 * counts[key] / max(totals[key], 1)

    print(f"{'file':34s}{'instructions':>14s}{'samples':>10s}")
    for file, counts in sorted(by_file.items(), key=lambda kv: -kv[1]["instructions"]):
        print(f"{file:34s}{share(counts, 'instructions'):13.1f}%{share(counts, 'samples'):9.1f}%")
    print(f"\n{'line':40s}{'instructions':>14s}{'samples':>10s}{'wavefronts (ideal)':>24s}")
    top = sorted(by_line.items(), key=lambda kv: -kv[1]["instructions"])[:count]
    for (file, line), counts in top:
        print(f"{file + ':' + str(line):40s}{share(counts, 'instructions'):13.1f}%"
              f"{share(counts, 'samples'):9.1f}%"
              f"{counts['wavefronts']:14.0f} ({counts['ideal']:.0f})")
    print_totals(totals)


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[2] == "--lines":
        lines(sys.argv[1], int(sys.argv[3]))
    elif len(sys.argv) == 3 and sys.argv[2] == "--stalls":
        stalls(sys.argv[1])
    elif len(sys.argv) >= 3 and not sys.argv[2].startswith("--"):
        main(sys.argv[1], sys.argv[2:])
    else:
        sys.exit(__doc__)
