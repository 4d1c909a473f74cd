#!/usr/bin/env bash
# Compiles every ```cpp block of the documentation against the public headers
# with -Wall -Wextra -Werror, so a snippet a reader copies builds cleanly.
#   check_snippets.sh <c++ compiler> <include dir> <root> [markdown files under root]
# Without files: <root>/README.md and <root>/docs/*.md.
#
# The convention, in the markdown itself:
# - A ```cpp block is a statement block: it is compiled as the body of a
#   function returning simpler::Status, so it may return an error as the
#   reader's own code would (errors are values). Its #include lines are moved
#   to the top of the file.
# - The names a file's blocks use without declaring them (the buffers, sizes,
#   callables a sentence talks about) are declared once, at namespace scope,
#   in the file's prelude: an HTML comment, so readers never see it, opening
#   with the line `<!-- snippet prelude` and closing with the line `-->`.
# - `<!-- snippet: file-scope -->` on the line before a block compiles it at
#   namespace scope as it stands (a kernel, a whole function).
# - `<!-- snippet: skip <why> -->` before a block skips it; the reason is
#   required (say what the block needs that the public headers lack).
# Every block is its own translation unit (prelude + block), with #line
# directives so the compiler names the markdown file and line.
set -uo pipefail
cxx=$1 inc=$2 root=$3
shift 3
cd "$root" || exit 1
if [ $# -eq 0 ]; then set -- README.md docs/*.md; fi
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

checked=0 failed=0 skipped=0 errors=0
for md in "$@"; do
  stem=$(echo "$md" | tr '/.' '__')
  # awk writes one translation unit per checked block into $out and prints one
  # manifest line per block: "check <tu> <md>:<line>", "skip <md>:<line> <why>"
  # or "error <md>:<line> <message>".
  manifest=$(awk -v md="$md" -v out="$out" -v stem="$stem" '
    { L[NR] = $0 }
    function directive_error(i, msg) { printf "error %s:%d %s\n", md, i, msg; bad = 1 }
    END {
      prelude = ""; pending = ""; count = 0
      for (i = 1; i <= NR; i++) {
        line = L[i]
        if (line ~ /^[ \t]*<!-- snippet prelude[ \t]*$/) {
          prelude = sprintf("#line %d \"%s\"\n", i + 1, md)
          for (i++; i <= NR && L[i] !~ /^[ \t]*-->[ \t]*$/; i++) prelude = prelude L[i] "\n"
          continue
        }
        if (line ~ /^[ \t]*<!-- snippet/) {
          d = line
          sub(/^[ \t]*<!-- snippet:[ \t]*/, "", d)
          sub(/[ \t]*-->[ \t]*$/, "", d)
          if (d == "file-scope") { pending = "file-scope"; pending_line = i; continue }
          if (d ~ /^skip[ \t]+[^ \t]/) { pending = "skip"; reason = d; sub(/^skip[ \t]+/, "", reason); pending_line = i; continue }
          # A malformed directive fails the check; its block is not compiled.
          pending = "ignored"; pending_line = i
          if (d == "skip") { directive_error(i, "snippet: skip needs a reason"); continue }
          directive_error(i, "unknown snippet directive: " line); continue
        }
        if (line ~ /^[ \t]*```cpp[ \t]*$/) {
          indent = line; sub(/```cpp[ \t]*$/, "", indent)
          start = i + 1; body = ""; includes = ""
          for (i++; i <= NR && L[i] !~ /^[ \t]*```[ \t]*$/; i++) {
            text = L[i]
            if (substr(text, 1, length(indent)) == indent) text = substr(text, length(indent) + 1)
            if (pending != "file-scope" && text ~ /^[ \t]*#[ \t]*include/) {
              includes = includes sprintf("#line %d \"%s\"\n%s\n", i, md, text)
              text = ""
            }
            body = body text "\n"
          }
          kind = pending == "" ? "statements" : pending
          pending = ""
          if (kind == "ignored") continue
          if (kind == "skip") { printf "skip %s:%d %s\n", md, start - 1, reason; continue }
          tu = sprintf("%s/%s_%d.cpp", out, stem, ++count)
          printf "%s", includes > tu
          printf "%s", prelude > tu
          if (kind == "statements") printf "#include <simpler/status.h>\nsimpler::Status snippet_at_line_%d() {\n", start - 1 > tu
          printf "#line %d \"%s\"\n%s", start, md, body > tu
          if (kind == "statements") printf "return simpler::Status();\n}\n" > tu
          close(tu)
          printf "check %s %s:%d\n", tu, md, start - 1
          continue
        }
        if (pending != "" && line !~ /^[ \t]*$/) {
          directive_error(pending_line, "snippet directive not followed by a ```cpp block")
          pending = ""
        }
      }
      if (pending != "") directive_error(pending_line, "snippet directive not followed by a ```cpp block")
    }' "$md")
  while read -r what a b; do
    case $what in
      check)
        checked=$((checked + 1))
        if ! log=$("$cxx" -std=c++20 -Wall -Wextra -Werror -I"$inc" -x c++ -c "$a" -o /dev/null 2>&1); then
          failed=$((failed + 1))
          echo "FAIL $b"
          echo "$log" | grep -v "^$out" | sed 's/^/  /'
        else
          echo "ok   $b"
        fi
        ;;
      skip) skipped=$((skipped + 1)); echo "skip $a ($b)" ;;
      error) errors=$((errors + 1)); echo "ERROR $a $b" ;;
    esac
  done <<<"$manifest"
done

echo "$failed of $checked snippets failed, $skipped skipped, $errors directive errors"
[ "$checked" -gt 0 ] && [ "$failed" -eq 0 ] && [ "$errors" -eq 0 ]
