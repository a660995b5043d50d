package main

// The Authority's keys and the checks on every event read: its signature, its place in the Group's
// log and its link to the event before it. The rules are those of check_history() in
// missionweave_server/services/authority/keys.py and of missionweave/kernel/eventlog.py.

import (
	"bytes"
	"crypto/ed25519"
	"encoding/hex"
	"fmt"

	"google.golang.org/protobuf/proto"
	"lukechampine.com/blake3"

	pb "github.com/missionweave/missionweave/gen/go/missionweave/v1"
)

// authorityKeyID is authority_key_id() in signing.py: "authority:" and the first 16 hex
// characters of the BLAKE3 hash of the public key.
func authorityKeyID(public []byte) string {
	sum := blake3.Sum256(public)
	return "authority:" + hex.EncodeToString(sum[:])[:16]
}

// authorityKeys turns GetAuthorityKey's answer into the keys events may be signed with: the
// current one and every one it rotated away from. Each key must match its id, and each after the
// first must come with a rotation signed by the key before it and by itself, so the whole chain
// is vouched for by any one of its keys: `pinned` (hex, obtained out of band) may be any of them.
func authorityKeys(resp *pb.GetAuthorityKeyResponse, pinned string) (map[string]ed25519.PublicKey, error) {
	history := resp.GetKeys()
	if len(history) == 0 { // a server without a key history answers the current key alone
		history = []*pb.AuthorityKey{{KeyId: resp.GetKeyId(), PublicKey: resp.GetPublicKey()}}
	}
	keys := make(map[string]ed25519.PublicKey, len(history))
	pinFound := pinned == ""
	for i, record := range history {
		if len(record.GetPublicKey()) != ed25519.PublicKeySize || record.GetKeyId() != authorityKeyID(record.GetPublicKey()) {
			return nil, fmt.Errorf("the Authority key %s does not match its public key", record.GetKeyId())
		}
		if i > 0 {
			if err := checkRotation(history[i-1], record); err != nil {
				return nil, fmt.Errorf("the Authority's key history does not hold: %w", err)
			}
		}
		keys[record.GetKeyId()] = record.GetPublicKey()
		pinFound = pinFound || hex.EncodeToString(record.GetPublicKey()) == pinned
	}
	last := history[len(history)-1]
	if last.GetKeyId() != resp.GetKeyId() || !bytes.Equal(last.GetPublicKey(), resp.GetPublicKey()) {
		return nil, fmt.Errorf("the Authority's key history ends with %s, not its current key %s", last.GetKeyId(), resp.GetKeyId())
	}
	if !pinFound {
		return nil, fmt.Errorf("the Authority key %x is not the pinned key %s, nor rotated from it", resp.GetPublicKey(), pinned)
	}
	return keys, nil
}

// checkRotation says whether record's rotation vouches for it as the successor of previous.
func checkRotation(previous, record *pb.AuthorityKey) error {
	env := record.GetRotation()
	broken := fmt.Errorf("the rotation from %s to %s is not signed by both keys", previous.GetKeyId(), record.GetKeyId())
	if env.GetPayloadType() != keyRotationType {
		return broken
	}
	var rotation pb.AuthorityKeyRotation
	if err := proto.Unmarshal(env.GetPayload(), &rotation); err != nil {
		return fmt.Errorf("the rotation to %s does not parse", record.GetKeyId())
	}
	signedBy := func(key *pb.AuthorityKey) bool {
		for _, s := range env.GetSignatures() {
			if s.GetKeyId() == key.GetKeyId() && verifySignature(env, s, key.GetPublicKey()) {
				return true
			}
		}
		return false
	}
	if rotation.GetPreviousKeyId() != previous.GetKeyId() || !bytes.Equal(rotation.GetPreviousPublicKey(), previous.GetPublicKey()) ||
		rotation.GetKeyId() != record.GetKeyId() || !bytes.Equal(rotation.GetPublicKey(), record.GetPublicKey()) ||
		!signedBy(previous) || !signedBy(record) {
		return broken
	}
	return nil
}

// follower checks the events of one Group as they are read, in order.
type follower struct {
	groupID string
	keys    map[string]ed25519.PublicKey
	covered uint64 // the last sequence read (delivered or withheld)
	// The link the next event must name (BLAKE3 of the last delivered payload), when that event
	// directly precedes it: across withheld sequences a member cannot check the chain.
	lastSequence uint64
	link         []byte
}

// batch checks that a ReadEvents batch continues the previous one: a member's batches cover every
// sequence, delivered or withheld, so a gap means events were lost, not hidden.
func (f *follower) batch(first, last uint64) error {
	if first != f.covered+1 || last < first {
		return fmt.Errorf("a batch covers sequences %d..%d after %d: the log is not contiguous", first, last, f.covered)
	}
	f.covered = last
	return nil
}

// verifyEvent checks one signed event before anything in it is believed: the Authority's
// signature over PAE(payload type, payload) with a key of its history. It returns the event and
// the id of the key that signed it.
func verifyEvent(keys map[string]ed25519.PublicKey, env *pb.SignedEnvelope) (*pb.Event, string, error) {
	if env.GetPayloadType() != eventType {
		return nil, "", fmt.Errorf("an envelope has payload type %q, not %q", env.GetPayloadType(), eventType)
	}
	for _, s := range env.GetSignatures() {
		if key, ok := keys[s.GetKeyId()]; ok && verifySignature(env, s, key) {
			var event pb.Event
			if err := proto.Unmarshal(env.GetPayload(), &event); err != nil {
				return nil, "", fmt.Errorf("a signed payload is not an Event: %w", err)
			}
			return &event, s.GetKeyId(), nil
		}
	}
	return nil, "", fmt.Errorf("an event is not signed by a key of the Authority (%d in its history)", len(keys))
}

// event verifies one event read from the Group: its signature, then its Group, its order and its
// link to the event before it.
func (f *follower) event(env *pb.SignedEnvelope) (*pb.Event, string, error) {
	event, keyID, err := verifyEvent(f.keys, env)
	if err != nil {
		return nil, "", err
	}
	seq := event.GetSequence()
	switch {
	case event.GetGroupId() != f.groupID:
		return nil, "", fmt.Errorf("an event of %s was read from %s", event.GetGroupId(), f.groupID)
	case seq <= f.lastSequence || seq > f.covered:
		return nil, "", fmt.Errorf("event %d is out of order (after %d, in a batch through %d)", seq, f.lastSequence, f.covered)
	case seq == f.lastSequence+1 && f.link != nil && len(event.GetPreviousDigest()) > 0 && !bytes.Equal(event.GetPreviousDigest(), f.link):
		return nil, "", fmt.Errorf("event %d does not link to event %d (previous_digest)", seq, f.lastSequence)
	}
	f.lastSequence = seq
	// link_of() in eventlog.py: an erased event's chain value is the digest of what was first signed.
	if original := event.GetRedaction().GetOriginalEventDigest(); len(original) > 0 {
		f.link = original
	} else {
		sum := blake3.Sum256(env.GetPayload())
		f.link = sum[:]
	}
	return event, keyID, nil
}
