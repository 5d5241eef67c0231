#!/usr/bin/env bash
# Makes the certificates the TLS tests and benchmarks use, in DIR (created):
#   ca.pem ca.key          the run's CA
#   node.pem node.key      a certificate it signs (CN tether-node; SAN
#                          localhost, 127.0.0.1 and any extra names given)
#   other-ca.pem           another CA, which the run does not trust
#   other.pem other.key    a certificate that other CA signs
# Each is made with Debian's openssl command; EC P-256 keys, valid 2 days.
# Usage: make_certs.sh DIR [DNS-NAME...]
set -euo pipefail
dir=${1:?usage: make_certs.sh DIR [DNS-NAME...]}
shift
mkdir -p "$dir"
cd "$dir"
command -v openssl > /dev/null || { echo "make_certs.sh: the openssl command is missing (Debian package openssl)" >&2; exit 1; }

san="DNS:localhost,IP:127.0.0.1"
for name in "$@"; do san+=",DNS:$name"; done

ca() {  # ca NAME CN
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
    -keyout "$1.key" -out "$1.pem" -days 2 -subj "/CN=$2" \
    -addext basicConstraints=critical,CA:TRUE \
    -addext keyUsage=critical,keyCertSign,cRLSign 2> /dev/null
}
leaf() {  # leaf NAME CA CN
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
    -keyout "$1.key" -out "$1.csr" -subj "/CN=$3" 2> /dev/null
  printf 'subjectAltName=%s\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth,clientAuth\n' "$san" > "$1.ext"
  openssl x509 -req -in "$1.csr" -CA "$2.pem" -CAkey "$2.key" \
    -CAcreateserial -out "$1.pem" -days 2 -extfile "$1.ext" 2> /dev/null
  rm -f "$1.csr" "$1.ext"
}
ca ca "tether test CA"
leaf node ca tether-node
ca other-ca "another CA"
leaf other other-ca tether-intruder
chmod 600 ./*.key
