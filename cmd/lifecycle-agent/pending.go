package main

// Issues that fill in the commands still stubbed with notImplemented. One
// place to update as they land.
const (
	issueRun     = "3"
	issueStatus  = "3"
	issueRequest = "4"
	issueDoctor  = "4"
	issueJournal = "3"
)
