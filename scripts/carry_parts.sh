#!/usr/bin/env bash
# carry_parts.sh: files larger than one device call may carry, cut into parts here and joined there.
#
#   scripts/carry_parts.sh split OUT MIB FILE...   cut FILEs into folders OUT/01, OUT/02, ... of at most MIB MiB
#                                                  each; every folder holds SHA256SUMS of the whole files
#   scripts/carry_parts.sh join DEST PARTDIR...    join every file whose pieces are all in the PARTDIRs into DEST,
#                                                  checked against SHA256SUMS, written aside and renamed; says
#                                                  which files still lack pieces (exit 1 then)
#
# A lent GPU machine takes 64 MiB a call, the working tree included, and keeps what earlier calls left while it
# stays warm (30 s idle). cuDNN frontend 1.32.0's lock adds about 204 MB of wheels (nvidia-cutlass-dsl's libraries,
# 92 MB each), so they travel over several calls, one part folder each:
#
#   scripts/carry_parts.sh split .whl/parts 30 /tmp/neww/*.whl
#   run(carry=[".whl/parts/01"], command="mkdir -p /tmp/parts && cp -r .whl/parts/01 /tmp/parts/")   # then 02, ...
#   run(command="scripts/carry_parts.sh join /tmp/wheels /tmp/parts/*")
set -euo pipefail

usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0" >&2; exit 2; }

split_files() {
    local out=$1 mib=$2; shift 2
    [[ $mib =~ ^[1-9][0-9]*$ ]] || { echo "carry_parts: MIB must be a whole number of MiB, not '$mib'" >&2; exit 2; }
    [ $# -gt 0 ] || usage
    local limit=$(( mib * 1024 * 1024 )) folder=1 used=0 f name size offset piece k plan dir
    for f in "$@"; do [ -f "$f" ] || { echo "carry_parts: no file '$f'" >&2; exit 2; }; done
    rm -rf "$out.tmp" && mkdir -p "$out.tmp"
    for f in "$@"; do (cd "$(dirname "$f")" && sha256sum "$(basename "$f")"); done > "$out.tmp/SHA256SUMS"
    for f in "$@"; do
        name=$(basename "$f"); size=$(stat -c %s "$f"); offset=0; plan=()
        while [ "$offset" -lt "$size" ]; do   # pieces fill each folder up to the limit, in order
            if [ "$used" -ge "$limit" ]; then folder=$(( folder + 1 )); used=0; fi
            piece=$(( size - offset )); [ "$piece" -le $(( limit - used )) ] || piece=$(( limit - used ))
            plan+=("$folder:$offset:$piece"); offset=$(( offset + piece )); used=$(( used + piece ))
        done
        for k in "${!plan[@]}"; do
            IFS=: read -r folder offset piece <<< "${plan[$k]}"
            dir=$out.tmp/$(printf %02d "$folder"); mkdir -p "$dir"
            dd if="$f" of="$dir/$name.part$(( k + 1 ))-of-${#plan[@]}" bs=1M skip="$offset" count="$piece" \
                iflag=skip_bytes,count_bytes status=none
        done
    done
    for dir in "$out.tmp"/*/; do cp "$out.tmp/SHA256SUMS" "$dir"; done
    rm "$out.tmp/SHA256SUMS" && rm -rf "$out" && mv "$out.tmp" "$out"
    for dir in "$out"/*/; do echo "$dir: $(du -sb "$dir" | cut -f1) bytes"; done
}

join_files() {
    local dest=$1; shift
    mkdir -p "$dest"
    local sums sum name count k piece first missing=0
    sums=$(for dir in "$@"; do [ ! -f "$dir/SHA256SUMS" ] || cat "$dir/SHA256SUMS"; done | sort -u)
    [ -n "$sums" ] || { echo "carry_parts: no SHA256SUMS in $*" >&2; exit 1; }
    while read -r sum name; do
        if [ -f "$dest/$name" ] && [ "$(sha256sum < "$dest/$name" | cut -d' ' -f1)" = "$sum" ]; then continue; fi
        first=$(find "$@" -maxdepth 1 -name "$name.part1-of-*" | head -1)
        if [ -z "$first" ]; then echo "carry_parts: $name: no pieces here yet"; missing=1; continue; fi
        count=${first##*-of-}
        : > "$dest/.$name.part"
        for (( k = 1; k <= count; k++ )); do
            piece=$(find "$@" -maxdepth 1 -name "$name.part$k-of-$count" | head -1)
            if [ -z "$piece" ]; then
                echo "carry_parts: $name: piece $k of $count not here yet"; missing=1; rm -f "$dest/.$name.part"
                continue 2
            fi
            cat "$piece" >> "$dest/.$name.part"
        done
        if [ "$(sha256sum < "$dest/.$name.part" | cut -d' ' -f1)" != "$sum" ]; then
            rm -f "$dest/.$name.part"; echo "carry_parts: $name: the joined pieces do not match its sha256" >&2; exit 1
        fi
        mv "$dest/.$name.part" "$dest/$name"; echo "carry_parts: $name joined ($count pieces)"
    done <<< "$sums"
    return "$missing"
}

case "${1:-}" in
    split) [ $# -ge 4 ] || usage; shift; split_files "$@" ;;
    join) [ $# -ge 3 ] || usage; shift; join_files "$@" ;;
    *) usage ;;
esac
