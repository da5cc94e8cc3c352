package s3

import (
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestSignExamples signs the requests of the S3 documentation's SigV4
// examples ("Examples: Signature Calculations", the example credentials,
// bucket examplebucket, 2013-05-24) and checks the signatures published
// there.
func TestSignExamples(t *testing.T) {
	c := creds{AccessKeyID: "AKIAIOSFODNN7EXAMPLE", SecretAccessKey: "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"}
	now := time.Date(2013, 5, 24, 0, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name, method, path, query string
		header                    map[string]string
		payload                   string
		signed, sig               string
	}{
		{"GET object", "GET", "/test.txt", "", map[string]string{"Range": "bytes=0-9"}, emptySHA256,
			"host;range;x-amz-content-sha256;x-amz-date", "f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41"},
		{"PUT object", "PUT", "/" + escapePath("test$file.text"), "", map[string]string{"Date": "Fri, 24 May 2013 00:00:00 GMT", "X-Amz-Storage-Class": "REDUCED_REDUNDANCY"},
			"44ce7dd67c959e0d3524ffac1771dfbba87d2b6b4b4e99e42034a8b803f8b072",
			"date;host;x-amz-content-sha256;x-amz-date;x-amz-storage-class", "98ad721746da40c64f1a55b78f14c238d841ea1380cd77a1b5971af0ece108bd"},
		{"GET lifecycle", "GET", "/", "lifecycle", nil, emptySHA256,
			"host;x-amz-content-sha256;x-amz-date", "fea454ca298b7da1c68078a5d1bdbfbbe0d65c699e0f91ac7a200a0136783543"},
		{"list objects", "GET", "/", "max-keys=2&prefix=J", nil, emptySHA256,
			"host;x-amz-content-sha256;x-amz-date", "34b48302e7b5fa45bde8084f4b7868a86f0a534bc59db6670ed5711ef69dc6f7"},
	} {
		req, err := http.NewRequest(tc.method, "https://examplebucket.s3.amazonaws.com"+tc.path+"?"+tc.query, nil)
		if err != nil {
			t.Fatal(err)
		}
		for k, v := range tc.header {
			req.Header.Set(k, v)
		}
		sign(req, c, "us-east-1", tc.payload, now)
		want := "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request, SignedHeaders=" + tc.signed + ", Signature=" + tc.sig
		if got := req.Header.Get("Authorization"); got != want {
			t.Errorf("%s:\n got %s\nwant %s", tc.name, got, want)
		}
	}
}

func TestEscape(t *testing.T) {
	for in, want := range map[string]string{
		"files/a b+c~d": "files/a%20b%2Bc~d",
		"é$":            "%C3%A9%24",
	} {
		if got := escapePath(in); got != want {
			t.Errorf("escapePath(%q) = %q, want %q", in, got, want)
		}
	}
	if got := canonicalQuery(map[string][]string{"prefix": {"a/b c"}, "list-type": {"2"}}); !strings.HasPrefix(got, "list-type=2&prefix=a%2Fb%20c") {
		t.Errorf("canonicalQuery = %q", got)
	}
}
