package main

// The refusals a live mesh cannot be made to provoke: a tampered event, a broken chain, a forged
// rotation. (tests/test_go_agent.py checks the agent against a live mesh; `make go-check` runs these.)

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/hex"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"
	"lukechampine.com/blake3"

	pb "github.com/missionweave/missionweave/gen/go/missionweave/v1"
)

func newAuthorityKey(t *testing.T) (*pb.AuthorityKey, ed25519.PrivateKey) {
	t.Helper()
	public, private, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return &pb.AuthorityKey{KeyId: authorityKeyID(public), PublicKey: public}, private
}

func signedEvent(t *testing.T, key ed25519.PrivateKey, keyID string, event *pb.Event) *pb.SignedEnvelope {
	t.Helper()
	env, err := signEnvelope(event, eventType, key, keyID)
	if err != nil {
		t.Fatal(err)
	}
	return env
}

func TestPAEIsTheDSSEEncodingOfSigningPy(t *testing.T) {
	if got := string(pae("t/x", []byte("ab c"))); got != "DSSEv1 3 t/x 4 ab c" {
		t.Fatalf("pae = %q", got)
	}
	if got := string(pae("é", nil)); got != "DSSEv1 2 é 0 " { // lengths in bytes, not characters
		t.Fatalf("pae = %q", got)
	}
}

func TestEventsAreCheckedBeforeTheyAreBelieved(t *testing.T) {
	record, key := newAuthorityKey(t)
	keys := map[string]ed25519.PublicKey{record.GetKeyId(): record.GetPublicKey()}
	first := signedEvent(t, key, record.GetKeyId(), &pb.Event{GroupId: "g", Sequence: 1, EventId: "e1"})
	link := blake3.Sum256(first.GetPayload())
	second := signedEvent(t, key, record.GetKeyId(), &pb.Event{GroupId: "g", Sequence: 2, EventId: "e2", PreviousDigest: link[:]})

	f := &follower{groupID: "g", keys: keys}
	if err := f.batch(1, 2); err != nil {
		t.Fatal(err)
	}
	for _, env := range []*pb.SignedEnvelope{first, second} {
		if _, keyID, err := f.event(env); err != nil || keyID != record.GetKeyId() {
			t.Fatalf("a good event refused: %v", err)
		}
	}

	tampered := proto.Clone(first).(*pb.SignedEnvelope)
	tampered.Payload[len(tampered.Payload)-1] ^= 1
	otherKey := proto.Clone(first).(*pb.SignedEnvelope)
	otherKey.Signatures[0].KeyId = "authority:0000000000000000"
	wrongType := proto.Clone(first).(*pb.SignedEnvelope)
	wrongType.PayloadType = commandType
	for name, env := range map[string]*pb.SignedEnvelope{"tampered": tampered, "unknown key": otherKey, "type": wrongType} {
		if _, _, err := verifyEvent(keys, env); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}

	unlinked := signedEvent(t, key, record.GetKeyId(), &pb.Event{GroupId: "g", Sequence: 2, PreviousDigest: make([]byte, 32)})
	chain := &follower{groupID: "g", keys: keys}
	_ = chain.batch(1, 2)
	if _, _, err := chain.event(first); err != nil {
		t.Fatal(err)
	}
	if _, _, err := chain.event(unlinked); err == nil || !strings.Contains(err.Error(), "does not link") {
		t.Errorf("a broken chain: %v", err)
	}
	if err := (&follower{covered: 3}).batch(5, 6); err == nil {
		t.Error("a batch after a gap was accepted")
	}
	if _, _, err := (&follower{groupID: "other", keys: keys, covered: 1}).event(first); err == nil {
		t.Error("an event of another Group was accepted")
	}
}

func TestRotatedKeysCountOnlyWhenBothKeysSignTheRotation(t *testing.T) {
	old, oldKey := newAuthorityKey(t)
	next, nextKey := newAuthorityKey(t)
	rotation := &pb.AuthorityKeyRotation{
		PreviousKeyId: old.GetKeyId(), PreviousPublicKey: old.GetPublicKey(),
		KeyId: next.GetKeyId(), PublicKey: next.GetPublicKey(),
	}
	env, err := signEnvelope(rotation, keyRotationType, oldKey, old.GetKeyId())
	if err != nil {
		t.Fatal(err)
	}
	bySelf, _ := signEnvelope(rotation, keyRotationType, nextKey, next.GetKeyId())
	next.Rotation = proto.Clone(env).(*pb.SignedEnvelope)
	next.Rotation.Signatures = append(next.Rotation.Signatures, bySelf.Signatures[0])
	resp := &pb.GetAuthorityKeyResponse{KeyId: next.GetKeyId(), PublicKey: next.GetPublicKey(), Keys: []*pb.AuthorityKey{old, next}}

	keys, err := authorityKeys(resp, "")
	if err != nil || len(keys) != 2 {
		t.Fatalf("a recorded rotation refused: %v", err)
	}
	if _, err := authorityKeys(resp, hex.EncodeToString(old.GetPublicKey())); err != nil {
		t.Errorf("a pin of the retired key refused: %v", err)
	}
	if _, err := authorityKeys(resp, strings.Repeat("00", 32)); err == nil {
		t.Error("a pin of another key was accepted")
	}
	next.Rotation = env // signed by the old key only
	if _, err := authorityKeys(resp, ""); err == nil {
		t.Error("a rotation the new key did not sign was accepted")
	}
}
