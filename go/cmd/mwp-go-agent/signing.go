package main

// Keys and signatures, byte for byte as missionweave/kernel/signing.py makes them: the mesh checks
// every signature this file produces (OpenSession, call proofs, commands), so a difference in one
// byte is a refusal, not a silent mismatch.

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"strconv"
	"strings"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	pb "github.com/missionweave/missionweave/gen/go/missionweave/v1"
)

// Payload types: part of what is signed.
const (
	commandType     = "application/vnd.missionweave.v1.command+protobuf"
	eventType       = "application/vnd.missionweave.v1.event+protobuf"
	openSessionType = "application/vnd.missionweave.v1.open-session+protobuf"
	// registerIdentityType is what an administrator signs to register an identity.
	registerIdentityType = "application/vnd.missionweave.v1.register-identity+protobuf"
	callProofType        = "application/vnd.missionweave.v1.call-proof+protobuf"
	keyRotationType      = "application/vnd.missionweave.v1.authority-key-rotation+protobuf"
	// The metadata entry a call proof travels in (gRPC base64-encodes "-bin" values itself).
	callProofMetadata = "mwp-call-proof-bin"
)

// pae is the DSSE v1 pre-authentication encoding, pae() in signing.py:
// "DSSEv1" SP len(type) SP type SP len(payload) SP payload, lengths in bytes, in decimal.
func pae(payloadType string, payload []byte) []byte {
	out := make([]byte, 0, len(payloadType)+len(payload)+32)
	out = append(out, "DSSEv1 "...)
	out = strconv.AppendInt(out, int64(len(payloadType)), 10)
	out = append(out, ' ')
	out = append(out, payloadType...)
	out = append(out, ' ')
	out = strconv.AppendInt(out, int64(len(payload)), 10)
	out = append(out, ' ')
	return append(out, payload...)
}

// signEnvelope is sign_envelope() in signing.py: one signature over PAE of the exact payload bytes.
func signEnvelope(msg proto.Message, payloadType string, key ed25519.PrivateKey, keyID string) (*pb.SignedEnvelope, error) {
	payload, err := proto.Marshal(msg)
	if err != nil {
		return nil, err
	}
	sig := ed25519.Sign(key, pae(payloadType, payload))
	return &pb.SignedEnvelope{
		Payload:     payload,
		PayloadType: payloadType,
		Signatures:  []*pb.Signature{{KeyId: keyID, Sig: sig}},
	}, nil
}

// verifySignature checks one signature of an envelope over PAE(its payload type, its payload).
func verifySignature(env *pb.SignedEnvelope, sig *pb.Signature, public ed25519.PublicKey) bool {
	return ed25519.Verify(public, pae(env.GetPayloadType(), env.GetPayload()), sig.GetSig())
}

// readKey reads a key file as `mwp keygen` writes it (read_key() in signing.py): the 32-byte
// Ed25519 seed as 64 hex characters, in a file nobody else may read.
func readKey(path string) (ed25519.PrivateKey, error) {
	info, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("key file %s: %w (make one with `mwp keygen %s`)", path, err, path)
	}
	if mode := info.Mode().Perm(); mode&0o077 != 0 {
		return nil, fmt.Errorf("key file %s has mode %o; it must not be readable by others (0600)", path, mode)
	}
	text, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	seed, err := hex.DecodeString(strings.TrimSpace(string(text)))
	if err != nil || len(seed) != ed25519.SeedSize {
		return nil, fmt.Errorf("key file %s is not an Ed25519 key (64 hex characters, as `mwp keygen` writes)", path)
	}
	return ed25519.NewKeyFromSeed(seed), nil
}

// session is an open session: the identity, its epoch and the session key that signs for it.
type session struct {
	identityID string
	epoch      uint64
	key        ed25519.PrivateKey
}

// keyID is session_key_id() in signing.py.
func (s *session) keyID() string {
	return fmt.Sprintf("%s#session-%d", s.identityID, s.epoch)
}

// callProof is call_proof() of missionweave/sdk/credentials.py: a serialised SignedEnvelope over a
// fresh CallProof for one call of `method` (docs/security.md, "The call proof, for any language").
func (s *session) callProof(method, audience string) ([]byte, error) {
	env, err := signEnvelope(&pb.CallProof{
		IdentityId:   s.identityID,
		SessionEpoch: s.epoch,
		Method:       method,
		Audience:     audience,
		IssuedAt:     timestamppb.Now(),
		Nonce:        nonce(),
	}, callProofType, s.key, s.keyID())
	if err != nil {
		return nil, err
	}
	return proto.Marshal(env)
}

// nonce returns 16 random bytes (the servers take 16..64).
func nonce() []byte {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		panic(err) // no randomness: nothing this agent signs would be safe
	}
	return b
}
