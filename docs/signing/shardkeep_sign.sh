#!/usr/bin/env bash
# Sign and send a request to shardkeep's internal API (`/v1/internal/...`) with bash, openssl
# and curl. Same scheme, options and exit statuses as shardkeep_sign.py; see README.md.
#
#   export SHARDKEEP_SECRET=...   # the text after `ops:` in SHARDKEEP_INTERNAL_KEYS
#   ./shardkeep_sign.sh --key-id ops GET '/v1/internal/persistence-retry/dead-letters?limit=5'
#   ./shardkeep_sign.sh --key-id ops POST /v1/internal/persistence-retry/dead-letters/requeue \
#       --body '{"rpc_version":1,"dead_letter_id":"..."}'
#
# Options: --base URL (default $SHARDKEEP_API_URL or http://127.0.0.1:7400), --key-id ID,
# --secret-env NAME (default SHARDKEEP_SECRET), --body TEXT | --body-file PATH (- for stdin),
# --print-headers (print the headers and the canonical string, send nothing),
# --timestamp UNIX_SECONDS, --nonce NONCE.
#
# Exit status: 0 on a 2xx answer (the body goes to stdout as received); 1 on any other HTTP
# status (`shardkeep_sign: HTTP <status>` and the body go to stderr); 2 on a usage error; 3 when
# the server cannot be reached.
#
# The secret never appears on a command line: `openssl dgst -sha256 -hmac "$secret"` would put
# it in the argument list of a process, which every local user can read (ps,
# /proc/PID/cmdline). So `hmac_sha256_hex` builds HMAC-SHA256 (RFC 2104) from two plain
# `openssl dgst -sha256` runs, feeding the key through a pipe; the result is the same
# signature.
#
# Needs bash 3.2 or later, openssl, curl, od, tr. Source this file to reuse its functions
# without running it.

KEY_ID_HEADER=x-shardkeep-key-id
TIMESTAMP_HEADER=x-shardkeep-timestamp
NONCE_HEADER=x-shardkeep-nonce
SIGNATURE_HEADER=x-shardkeep-signature

# Lowercase hex of stdin.
hex_of_stdin() {
    od -An -v -tx1 | tr -d ' \n'
}

# Lowercase hex SHA-256 of stdin.
sha256_hex_of_stdin() {
    openssl dgst -sha256 -binary | hex_of_stdin
}

# printf escapes (\ooo) of the bytes in hex $1, to be written with printf "$escapes".
escapes_of_hex() {
    local hex=$1 out="" one i
    for ((i = 0; i < ${#hex}; i += 2)); do
        printf -v one '\\%03o' "$((16#${hex:i:2}))"
        out+=$one
    done
    printf '%s' "$out"
}

# hmac_sha256_hex KEY MESSAGE: lowercase hex HMAC-SHA256 of MESSAGE under the bytes of KEY,
# i.e. SHA256((K ^ opad) || SHA256((K ^ ipad) || MESSAGE)) with K the key zero-padded to the
# 64-byte block (or its SHA-256 if longer). Equal to
# `printf '%s' "$2" | openssl dgst -sha256 -hmac "$1"`, without the key in any argument list.
hmac_sha256_hex() {
    local key_hex ipad="" opad="" one byte i inner
    key_hex=$(printf '%s' "$1" | hex_of_stdin)
    if ((${#key_hex} > 128)); then
        key_hex=$(printf '%s' "$1" | sha256_hex_of_stdin)
    fi
    while ((${#key_hex} < 128)); do key_hex+=00; done
    for ((i = 0; i < 128; i += 2)); do
        byte=$((16#${key_hex:i:2}))
        printf -v one '\\%03o' "$((byte ^ 0x36))"
        ipad+=$one
        printf -v one '\\%03o' "$((byte ^ 0x5c))"
        opad+=$one
    done
    # shellcheck disable=SC2059 # the format is made of \ooo escapes only
    inner=$({ printf "$ipad"; printf '%s' "$2"; } | openssl dgst -sha256 -binary | hex_of_stdin)
    # shellcheck disable=SC2059
    { printf "$opad"; printf "$(escapes_of_hex "$inner")"; } | sha256_hex_of_stdin
}

# canonical METHOD PATH_AND_QUERY TIMESTAMP NONCE BODY_SHA256_HEX: the five signed lines.
canonical() {
    printf '%s\n%s\n%s\n%s\n%s' "$1" "$2" "$3" "$4" "$5"
}

usage() {
    cat >&2 <<'EOF'
usage: shardkeep_sign.sh [--base URL] --key-id ID [--secret-env NAME]
                         [--body TEXT | --body-file PATH] [--print-headers]
                         [--timestamp UNIX_SECONDS] [--nonce NONCE] METHOD PATH
EOF
}

fail_usage() {
    printf 'shardkeep_sign: error: %s\n' "$1" >&2
    usage
    exit 2
}

main() {
    local base=${SHARDKEEP_API_URL:-http://127.0.0.1:7400} key_id="" secret_env=SHARDKEEP_SECRET
    local body="" body_file="" have_body=0 print_headers=0 timestamp="" nonce=""
    local method="" path="" positional=0 opt value

    while (($# > 0)); do
        opt=$1
        case $opt in
        --print-headers) print_headers=1; shift; continue ;;
        -h | --help) usage; exit 0 ;;
        --) shift; break ;;
        --*=*) value=${opt#*=}; opt=${opt%%=*}; shift ;;
        --*)
            (($# >= 2)) || fail_usage "$opt needs a value"
            value=$2; shift 2 ;;
        *)
            case $positional in
            0) method=$opt ;;
            1) path=$opt ;;
            *) fail_usage "unexpected argument: $opt" ;;
            esac
            positional=$((positional + 1)); shift; continue ;;
        esac
        case $opt in
        --base) base=$value ;;
        --key-id) key_id=$value ;;
        --secret-env) secret_env=$value ;;
        --body) body=$value; have_body=$((have_body + 1)) ;;
        --body-file) body_file=$value; have_body=$((have_body + 2)) ;;
        --timestamp) timestamp=$value ;;
        --nonce) nonce=$value ;;
        *) fail_usage "unknown option: $opt" ;;
        esac
    done
    while (($# > 0)); do
        case $positional in
        0) method=$1 ;;
        1) path=$1 ;;
        *) fail_usage "unexpected argument: $1" ;;
        esac
        positional=$((positional + 1)); shift
    done

    [[ $secret_env =~ ^[A-Za-z_][A-Za-z0-9_]*$ ]] || fail_usage "--secret-env must name an environment variable"

    # The secret: read once and removed from the environment before any child process starts,
    # so none inherits it.
    local secret=${!secret_env:-}
    unset "$secret_env" 2>/dev/null || true
    # Surrounding whitespace is not part of a secret (the server trims it too).
    secret=${secret#"${secret%%[![:space:]]*}"}
    secret=${secret%"${secret##*[![:space:]]}"}
    [[ -n $secret ]] || fail_usage "the environment variable $secret_env is unset or empty"
    ((${#secret} >= 16)) || fail_usage "the secret in $secret_env is shorter than 16 bytes; the server accepts no such key"

    ((positional == 2)) || fail_usage "METHOD and PATH are required"
    [[ -n $key_id ]] || fail_usage "--key-id is required"
    ((have_body <= 2)) || fail_usage "give --body or --body-file, not both"
    [[ $method =~ ^[A-Za-z]+$ ]] || fail_usage "'$method' is not an HTTP method"
    method=$(printf '%s' "$method" | tr '[:lower:]' '[:upper:]')
    [[ $path == /* ]] || fail_usage "the path must start with / (the path and query only, no scheme or host)"
    # RFC 3986 unreserved and reserved characters and %: anything else is rewritten by some
    # client or proxy, and the signature covers the path exactly as the server receives it.
    local path_re='^[-A-Za-z0-9._~!$&'"'"'()*+,;=:@/?%]*$'
    [[ $path =~ $path_re ]] ||
        fail_usage "the path holds characters to percent-encode first (the signature covers the path exactly as sent)"
    [[ $key_id =~ ^[A-Za-z0-9_.-]+$ ]] || fail_usage "the key id must be 1 or more characters of [A-Za-z0-9_.-]"
    if [[ -n $timestamp ]]; then
        [[ $timestamp =~ ^-?[0-9]+$ ]] || fail_usage "--timestamp must be an integer (unix seconds)"
        # As an integer, so the header and the signed line hold the same digits ("007" -> "7").
        [[ $timestamp =~ ^-?0*[0-9]{1,18}$ ]] || fail_usage "--timestamp is out of range"
        local minus=""
        [[ $timestamp == -* ]] && minus=-
        timestamp=$((10#${timestamp#-}))
        [[ $timestamp == 0 ]] || timestamp=$minus$timestamp
    else
        timestamp=$(date +%s)
    fi
    if [[ -z $nonce ]]; then
        nonce=$(openssl rand -hex 16)
    fi
    [[ ${#nonce} -ge 16 && ${#nonce} -le 64 && $nonce =~ ^[A-Za-z0-9_-]+$ ]] ||
        fail_usage "the nonce must be 16 to 64 characters of [A-Za-z0-9_-]"

    # The body goes through a file, so the bytes hashed are the bytes curl sends.
    local tmp
    tmp=$(mktemp -d "${TMPDIR:-/tmp}/shardkeep_sign.XXXXXX")
    # shellcheck disable=SC2064 # expand $tmp now
    trap "rm -rf '$tmp'" EXIT
    local body_path=$tmp/body
    case $have_body in
    0) : >"$body_path" ;;
    1) printf '%s' "$body" >"$body_path" ;;
    2)
        if [[ $body_file == - ]]; then
            cat >"$body_path"
        else
            [[ -f $body_file && -r $body_file ]] || fail_usage "cannot read --body-file $body_file"
            cat -- "$body_file" >"$body_path"
        fi
        ;;
    esac

    local body_hash signed signature
    body_hash=$(sha256_hex_of_stdin <"$body_path")
    signed=$(canonical "$method" "$path" "$timestamp" "$nonce" "$body_hash")
    signature=$(hmac_sha256_hex "$secret" "$signed")

    if ((print_headers)); then
        printf '%s: %s\n' \
            "$KEY_ID_HEADER" "$key_id" \
            "$TIMESTAMP_HEADER" "$timestamp" \
            "$NONCE_HEADER" "$nonce" \
            "$SIGNATURE_HEADER" "$signature"
        printf '\n%s\n' "$signed"
        exit 0
    fi

    base=${base%/}
    [[ $base == http://* || $base == https://* ]] || fail_usage "--base must start with http:// or https://"
    local args=(
        --silent --show-error
        --globoff     # [] and {} are not URL patterns
        --path-as-is  # /./ and /../ are sent as signed
        --max-time 60
        --request "$method"
        --header "$KEY_ID_HEADER: $key_id"
        --header "$TIMESTAMP_HEADER: $timestamp"
        --header "$NONCE_HEADER: $nonce"
        --header "$SIGNATURE_HEADER: $signature"
        --header "Accept: application/json"
        --header "Expect:"
        --output "$tmp/response"
        --write-out '%{http_code}'
    )
    if ((have_body)); then
        args+=(--header "Content-Type: application/json" --data-binary "@$body_path")
    fi
    local status
    if ! status=$(curl "${args[@]}" "$base$path"); then
        printf 'shardkeep_sign: cannot reach %s (curl failed, see above)\n' "$base" >&2
        exit 3
    fi
    : >>"$tmp/response"
    if [[ $status == 2[0-9][0-9] ]]; then
        cat "$tmp/response"
        [[ -z $(tail -c 1 "$tmp/response") ]] || printf '\n'
        exit 0
    fi
    {
        printf 'shardkeep_sign: HTTP %s\n' "$status"
        cat "$tmp/response"
        [[ -z $(tail -c 1 "$tmp/response") ]] || printf '\n'
    } >&2
    exit 1
}

if [[ ${BASH_SOURCE[0]} == "$0" ]]; then
    set -euo pipefail
    export LC_ALL=C # lengths and character classes count bytes
    main "$@"
fi
