#!/bin/sh
# register.sh REGISTRY_URL SUBJECT SCHEMA_FILE
#
# Registers the Avro schema in SCHEMA_FILE (an .avsc) under SUBJECT of the
# Schema Registry at REGISTRY_URL and prints the registry's answer, the
# schema's id. Registering the same schema again returns the same id. Needs
# only sh, tr, sed and curl, so that it runs in a small curl image and on a
# workstation alike.
set -eu

if [ "$#" -ne 3 ]; then
	echo "usage: register.sh REGISTRY_URL SUBJECT SCHEMA_FILE" >&2
	exit 2
fi
url=${1%/} subject=$2 file=$3

# An empty request would register nothing the projector can read.
if [ ! -s "$file" ]; then
	echo "register.sh: $file: missing or empty" >&2
	exit 1
fi

# The request body is {"schema": "<the file's text as a JSON string>"}. A
# valid JSON file holds no control characters except tabs, carriage returns
# and newlines between tokens, so turning those into spaces keeps its
# meaning; escaping backslashes and then quotes makes it a JSON string.
schema=$(tr '\t\r\n' '   ' <"$file" | sed -e 's/\\/\\\\/g' -e 's/"/\\"/g')

printf '{"schemaType": "AVRO", "schema": "%s"}' "$schema" |
	curl --silent --show-error --fail-with-body \
		--retry 10 --retry-connrefused --retry-delay 2 \
		-X POST -H 'Content-Type: application/vnd.schemaregistry.v1+json' \
		--data-binary @- "$url/subjects/$subject/versions"
echo
