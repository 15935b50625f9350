package main

// Issues that fill in the commands still stubbed with notImplemented. One
// place to update as they land.
const (
	issueRequest = "4"
	issueDoctor  = "4"
)
