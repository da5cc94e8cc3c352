package redisclient

import (
	"fmt"
	"strings"
)

// SlotCount is the number of hash slots of a Redis Cluster.
const SlotCount = 16384

// HashTag returns the part of key that a Redis Cluster hashes: the text
// between the first "{" and the first "}" after it when that text is not
// empty, else the whole key.
func HashTag(key string) string {
	if s := strings.IndexByte(key, '{'); s >= 0 {
		if e := strings.IndexByte(key[s+1:], '}'); e > 0 {
			return key[s+1 : s+1+e]
		}
	}
	return key
}

// HasHashTag reports whether key carries a hash tag of its own.
func HasHashTag(key string) bool {
	if s := strings.IndexByte(key, '{'); s >= 0 {
		return strings.IndexByte(key[s+1:], '}') > 0
	}
	return false
}

// Slot is the hash slot of key: CRC16 (XMODEM) of its hash tag modulo 16384.
func Slot(key string) int {
	tag := HashTag(key)
	var crc uint16
	for i := 0; i < len(tag); i++ {
		crc ^= uint16(tag[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return int(crc) % SlotCount
}

// Tagged returns a prefix for the companion keys of key that hash to key's
// slot (Tagged(key)+":x" is in Slot(key)): key itself when it has a hash tag,
// else key in braces. A key without a hash tag that contains "}" cannot be
// wrapped so (the brace would end the tag early): an error names it.
func Tagged(key string) (string, error) {
	if HasHashTag(key) {
		return key, nil
	}
	if strings.ContainsRune(key, '}') {
		return "", fmt.Errorf("key %q contains \"}\" but no hash tag: in cluster mode give it one ({...}) or drop the brace", key)
	}
	return "{" + key + "}", nil
}
