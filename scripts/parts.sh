#!/usr/bin/env bash
# Move a folder (scripts/cuda_wheels.sh's wheels, a llama.cpp source tree) to a machine that takes
# files only a few MiB at a time, in parts, and put it back together there, checked:
#   scripts/parts.sh split DIR PARTS [SIZE_MIB]   PARTS/01, PARTS/02 ... of at most SIZE_MIB (60)
#                                                 each, files bigger than that cut in pieces, and
#                                                 PARTS/*/SHA256SUMS (every file of DIR, whole)
#   scripts/parts.sh join PARTS DIR               the parts (copied there in any order) back
#                                                 into DIR, every file checked against SHA256SUMS
set -euo pipefail
usage() { sed -n 2,8p "$0" >&2; exit 2; }
[ $# -ge 3 ] || usage

split_dir() {
  local dir=$1 parts=$2 limit=$(( ${3:-60} * 1024 * 1024 ))
  [ -d "$dir" ] || { echo "no folder $dir" >&2; exit 1; }
  [ ! -e "$parts" ] || { echo "$parts exists: give a new folder" >&2; exit 1; }
  mkdir -p "$parts"
  local work; work=$(mktemp -d)
  trap 'rm -rf "$work"' RETURN
  (cd "$dir" && find . -type f -printf '%P\n' | LC_ALL=C sort >"$work/files")
  (cd "$dir" && xargs -d '\n' sha256sum <"$work/files") >"$work/SHA256SUMS"
  # pieces: files as they are, or cut into limit-sized pieces named FILE.piece.NNN
  mkdir -p "$work/pieces"
  while IFS= read -r f; do
    mkdir -p "$work/pieces/$(dirname "$f")"
    if [ "$(stat -c %s "$dir/$f")" -le "$limit" ]; then
      ln -s "$(cd "$dir" && pwd)/$f" "$work/pieces/$f"
    else
      split -b "$limit" -d -a 3 "$dir/$f" "$work/pieces/$f.piece."
    fi
  done <"$work/files"
  # first fit: each part takes pieces while they fit under the limit
  local n=0 used=$limit size p
  while IFS= read -r p; do
    size=$(stat -L -c %s "$work/pieces/$p")
    if [ $((used + size)) -gt "$limit" ]; then
      n=$((n + 1)); used=0
    fi
    used=$((used + size))
    mkdir -p "$parts/$(printf %02d $n)/$(dirname "$p")"
    cp -L "$work/pieces/$p" "$parts/$(printf %02d $n)/$p"
  done < <(cd "$work/pieces" && find . \( -type f -o -type l \) -printf '%P\n' | LC_ALL=C sort)
  for part in "$parts"/*/; do cp "$work/SHA256SUMS" "$part"; done
  echo "$dir: $(wc -l <"$work/files") files in $n parts of at most $(( limit / 1024 / 1024 )) MiB under $parts"
}

join_dir() {
  local parts=$1 dir=$2 sums
  sums=$(find "$parts" -name SHA256SUMS | head -1)
  [ -n "$sums" ] || { echo "no SHA256SUMS under $parts: not made by scripts/parts.sh split" >&2; exit 1; }
  sums=$(cd "$(dirname "$sums")" && pwd)/SHA256SUMS
  mkdir -p "$dir"
  local f pieces
  while read -r _ f; do
    mkdir -p "$dir/$(dirname "$f")"
    if pieces=$(ls "$parts"/*/"$f" 2>/dev/null | head -1) && [ -n "$pieces" ]; then
      cp "$pieces" "$dir/$f"
    else
      # the pieces sort by their number, whichever part holds them
      find "$parts" -path "*/$f.piece.[0-9][0-9][0-9]" -printf '%f\t%p\n' | LC_ALL=C sort \
        | cut -f2 | xargs -r -d '\n' cat >"$dir/$f"
    fi
  done <"$sums"
  (cd "$dir" && sha256sum --quiet -c "$sums") \
    || { echo "$dir: some files differ from the original: a part is missing or damaged" >&2; exit 1; }
  echo "$dir: $(wc -l <"$sums") files, all as the original"
}

case $1 in
  split) split_dir "$2" "$3" "${4:-60}" ;;
  join) join_dir "$2" "$3" ;;
  *) usage ;;
esac
