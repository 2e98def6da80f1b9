package kv

import "testing"

// validToken must accept exactly the tokens decodeToken accepts (but for the line breaks the
// decoder skips, which no key holds), since recovery checks keys with it instead of decoding them.
func TestValidTokenAgreesWithDecode(t *testing.T) {
	t.Parallel()
	toks := []string{"", "A", "AA", "AAA", "AAAA", "AAAAA", "aGVsbG8", "aGVsbG8.", "a+b", "a/bc", "a=bc",
		"aGVs bG8", "-_-_", "_", "é", "aGVsbG8x", encodeToken("héllo/wörld. *>"), encodeToken("x")}
	for c := 0; c < 256; c++ {
		if c != '\r' && c != '\n' {
			toks = append(toks, "AB"+string(rune(c)), "ABC"+string([]byte{byte(c)}))
		}
	}
	for _, tok := range toks {
		_, err := decodeToken(tok)
		if got, want := validToken(tok), err == nil; got != want {
			t.Errorf("validToken(%q) = %v, decodeToken error %v", tok, got, err)
		}
	}
}
